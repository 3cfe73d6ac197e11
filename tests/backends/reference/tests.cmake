# Reference backend tests.
strideattn_test(reference_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_test.cpp)
strideattn_test(reference_math_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_math_test.cpp)
strideattn_test(reference_sweep_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_sweep_test.cpp)
