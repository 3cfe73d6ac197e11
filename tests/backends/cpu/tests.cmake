# cpu backend against the fp64 reference, determinism and support rule.
strideattn_test(cpu_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_test.cpp)
strideattn_test(cpu_nonfinite_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_nonfinite_test.cpp)
# Scores at large logits: the exact score rounded once, the same in every pass.
strideattn_test(cpu_scores_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_scores_test.cpp)
strideattn_test(cpu_long_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_long_test.cpp)
strideattn_test(cpu_pool_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_pool_test.cpp)
# cpu and reference through plans and with cu_seqlens varlen arrays.
strideattn_test(host_plan_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/host_plan_test.cpp)
# The training features (softcap, bias, ALiBi, sinks, dropout, max logit) on cpu and reference.
strideattn_test(features_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/features_test.cpp)
# The training features where fp32 overflows, and the broadcast dBias's blocked sum.
strideattn_test(features_overflow_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/features_overflow_test.cpp)

# KV-cache attention on cpu against the gathered oracle; paged against contiguous.
strideattn_test(cpu_kvcache_test SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cpu_kvcache_test.cpp)
