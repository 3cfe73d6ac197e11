# Reference backend tests.
strideattn_test(reference_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_test.cpp)
strideattn_test(reference_math_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_math_test.cpp)
strideattn_test(reference_sweep_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reference_sweep_test.cpp)
# KV-cache attention on reference against the test's own gathered oracle; the `kv_cache` rule.
strideattn_test(reference_kvcache_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache_test.cpp)
