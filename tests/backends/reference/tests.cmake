# Reference backend and correctness-rule tests.
strideattn_test(reference_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_test.cpp)
strideattn_test(reference_math_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_math_test.cpp)
strideattn_test(compare_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/compare_test.cpp)
strideattn_test(reference_sweep_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_sweep_test.cpp)
