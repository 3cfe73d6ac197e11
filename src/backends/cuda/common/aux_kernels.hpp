// The memory-bound kernels around the attention passes (aux_kernels.cu), as the launch
// sequence (launch.cu) calls them. They only enqueue work on `stream`; each one's grid
// depends on the problem's sizes alone, so they are not in the kernel table.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common/kernel_params.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::cuda_impl {

// delta = rowsum(dO * O) over d_v, fp32 (backward pre-pass).
cudaError_t launch_delta(DType t, const KernelParams& kp, cudaStream_t stream);
// dK = scale * sum of the partial dK planes, dV = sum of the partial dV planes, in split order,
// stored through the dK / dV strides (when KernelParams::dkv_partial is set).
cudaError_t launch_reduce_dkv(DType t, const KernelParams& kp, cudaStream_t stream);
// dQ = scale * dq_accum, stored through the dQ strides for the tokens of every sequence
// (when KernelParams::dq_accum is set; varlen padding tokens are launch_zero_padding's).
cudaError_t launch_convert_dq(DType t, const KernelParams& kp, cudaStream_t stream);
// The max-logit output (when KernelParams::f.max_logit is set): every [sequence, head] element
// -inf, before the forward's atomic maxima (common/score_mod.cuh, record_max_logit).
cudaError_t launch_init_max_logit(const KernelParams& kp, cudaStream_t stream);
// d_sink[h] = -sum over sequences and rows that see a key of exp(sink[h] - LSE) delta (when
// KernelParams::f.d_sinks is set; after launch_delta): one block per head, a fixed order
// (deterministic).
cudaError_t launch_d_sinks(const KernelParams& kp, cudaStream_t stream);
// dBias (when KernelParams::f.dbias is set): stored by the dK/dV pass, every element of the
// view zeroed first (launch_zero_dbias: the pass writes only the pairs it visits); summed in
// f.dbias_accum, the accumulator zeroed first and stored through the view after
// (launch_convert_dbias). Each does nothing where the other applies.
cudaError_t launch_zero_dbias(const KernelParams& kp, cudaStream_t stream);
cudaError_t launch_convert_dbias(const KernelParams& kp, cudaStream_t stream);
// Varlen: zero the tokens of an output that belong to no sequence (and LSE = -inf there).
// `which`: 0 = forward outputs (O, LSE), 1 = backward outputs (dQ, dK, dV).
cudaError_t launch_zero_padding(const KernelParams& kp, int which, std::int64_t q_tokens, std::int64_t kv_tokens,
                                cudaStream_t stream);

}  // namespace strideattn::cuda_impl
