# cpu backend against the fp64 reference, determinism and support rule.
strideattn_test(cpu_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_test.cpp)
