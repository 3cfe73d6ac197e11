# Tests of validation, layout description, the harness's layout views and the C ABI
# (owner: validation helper).
strideattn_test(problem_validate_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/validate_test.cpp)
strideattn_test(problem_layout_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/layout_test.cpp)
