# Tests of the shared host-device math in src/common/ (mask tile arithmetic, indexing).
strideattn_test(common_attention_math_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/attention_math_test.cpp)
# Logging: levels, sinks, folding of repeated messages.
strideattn_test(common_log_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/log_test.cpp)
