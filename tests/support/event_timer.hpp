// Milliseconds per call of a function that enqueues GPU work on the default stream, by CUDA
// events around `runs` calls after `warmup` untimed ones: for the kernel tests' DISABLED_Timing
// diagnostics, which print and assert nothing about speed (bench/ makes the claims).
#pragma once

#include <cuda_runtime.h>

namespace strideattn::test_support {

template <class F>
double event_ms_per_call(F&& call, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) call();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < runs; ++i) call();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return double(ms) / runs;
}

}  // namespace strideattn::test_support
