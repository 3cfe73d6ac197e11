# Tests of the shared host-device math in src/common/ (mask tile arithmetic, indexing).
strideattn_test(common_attention_math_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/attention_math_test.cpp)
# Logging: levels, sinks, folding of repeated messages.
strideattn_test(common_log_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/log_test.cpp)
# The public fp16/bf16 conversions, over every 16-bit pattern.
strideattn_test(common_half_convert_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/half_convert_test.cpp)
# The check of tensor pointers against args.memory.
strideattn_test(common_memory_check_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/memory_check_test.cpp)
