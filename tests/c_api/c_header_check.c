/* Compiled as C (not C++): proves include/strideattn/strideattn.h is plain C, and reports
 * the struct sizes a C compiler sees so the C++ test can check both agree. */
#include "strideattn/strideattn.h"

size_t sa_test_forward_args_size_c(void) { return sizeof(sa_forward_args); }
size_t sa_test_backward_args_size_c(void) { return sizeof(sa_backward_args); }
size_t sa_test_forward_run_size_c(void) { return sizeof(sa_forward_run); }
size_t sa_test_backward_run_size_c(void) { return sizeof(sa_backward_run); }

/* A zero-initialised forward struct from C: every default. */
sa_forward_args sa_test_default_forward_args_c(void) {
  sa_forward_args a = {0};
  a.struct_size = sizeof a;
  return a;
}

sa_tensor_view sa_test_view_c(void* data, int32_t dtype, const int64_t shape[4], const int64_t stride[4]) {
  sa_tensor_view v;
  int i;
  v.data = data;
  v.dtype = dtype;
  for (i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.stride[i] = stride[i];
  }
  return v;
}
