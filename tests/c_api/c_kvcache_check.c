/* Compiled as C: the KV-cache structs of strideattn.h have the same layout in C as in C++. */
#include "strideattn/strideattn.h"

size_t sa_test_kvcache_args_size_c(void) { return sizeof(sa_kvcache_args); }
size_t sa_test_kvcache_cancel_offset_c(void) { return offsetof(sa_kvcache_args, cancel); }
