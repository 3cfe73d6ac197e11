# Reference backend and correctness-rule tests (owner: reference helper).
strideattn_test(reference_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_test.cpp)
