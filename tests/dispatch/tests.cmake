# Backend selection (`auto`) with fake backends and a faked platform, and its log lines;
# runs on any machine.
strideattn_test(dispatch_select_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/select_test.cpp)
# Plans and the plan cache with a counting fake backend: make once, run many, per-run checks.
strideattn_test(dispatch_plan_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/plan_test.cpp)
