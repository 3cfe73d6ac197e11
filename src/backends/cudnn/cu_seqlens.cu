// Kernels of cu_seqlens.hpp: the caller's cu_seqlens arrays -> cuDNN's tables and the token
// marks (one block computes the per-sequence tables and the ragged ends; a grid marks the
// tokens of each sequence), and the writes of the tokens cuDNN leaves (one warp per token).
#include <cuda_runtime.h>

#include <cmath>

#include "backends/cudnn/cu_seqlens.hpp"

namespace strideattn::detail::cudnn {

namespace {

using i64 = long long;

constexpr int kThreads = 256;
constexpr std::size_t kAlign = 256;

std::size_t up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

std::string last_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return std::string(what) + ": " + cudaGetErrorString(e);
}

int blocks_for(i64 threads) {
  const i64 b = (threads + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

__device__ i64 clamp64(i64 x, i64 lo, i64 hi) { return x < lo ? lo : (x > hi ? hi : x); }

// ragged_slot_is_query (cu_seqlens.hpp) on the device.
__device__ bool query_slot(int s) { return s == 0 || s == 3 || s == 4 || s == 5; }

struct Effective {
  i64 oq, lq, okv, lkv, kv_own;
};

// Sequence i as cuDNN is given it: lengths clamped to their bound, sequences to their view; a
// sequence without keys gets no query rows (its rows are written by the fix-up), and in the
// backward a sequence without query rows leaves its keys to the fix-up too (dK = dV = 0).
__device__ Effective effective(const CuSeqlensTables& t, i64 i) {
  Effective e;
  e.oq = clamp64(t.off_q ? i64(t.off_q[i]) : i64(t.cu_q[i]), 0, t.q_tokens);
  e.lq = clamp64(i64(t.cu_q[i + 1]) - i64(t.cu_q[i]), 0, t.max_q);
  e.lq = e.lq < t.q_tokens - e.oq ? e.lq : t.q_tokens - e.oq;
  e.okv = clamp64(t.off_kv ? i64(t.off_kv[i]) : i64(t.cu_kv[i]), 0, t.kv_tokens);
  e.lkv = clamp64(i64(t.cu_kv[i + 1]) - i64(t.cu_kv[i]), 0, t.max_kv);
  e.lkv = e.lkv < t.kv_tokens - e.okv ? e.lkv : t.kv_tokens - e.okv;
  if (e.lkv == 0) e.lq = 0;
  e.kv_own = t.backward && e.lq == 0 ? 0 : e.lkv;
  return e;
}

__global__ void tables_kernel(CuSeqlensTables t) {
  __shared__ i64 end_q[kThreads], end_kv[kThreads];
  i64 eq = 0, ekv = 0;
  const i64 stride = t.count + 1;
  for (i64 i = threadIdx.x; i < t.count; i += blockDim.x) {
    const Effective e = effective(t, i);
    t.seq_q[i] = static_cast<std::int32_t>(e.lq);
    t.seq_kv[i] = static_cast<std::int32_t>(e.lkv);
    t.lens64[i] = e.lq;
    t.offs64[i] = e.oq;
    t.kv_offs64[i] = e.okv;
    t.kv_own64[i] = e.kv_own;
    for (int s = 0; s < t.slots; ++s)
      t.ragged[s * stride + i] = static_cast<std::int32_t>((query_slot(s) ? e.oq : e.okv) * t.seq_stride[s]);
    eq = eq > e.oq + e.lq ? eq : e.oq + e.lq;
    ekv = ekv > e.okv + e.lkv ? ekv : e.okv + e.lkv;
  }
  end_q[threadIdx.x] = eq;
  end_kv[threadIdx.x] = ekv;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) {
      end_q[threadIdx.x] = end_q[threadIdx.x] > end_q[threadIdx.x + w] ? end_q[threadIdx.x] : end_q[threadIdx.x + w];
      end_kv[threadIdx.x] =
          end_kv[threadIdx.x] > end_kv[threadIdx.x + w] ? end_kv[threadIdx.x] : end_kv[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0)
    for (int s = 0; s < t.slots; ++s)
      t.ragged[s * stride + t.count] =
          static_cast<std::int32_t>((query_slot(s) ? end_q[0] : end_kv[0]) * t.seq_stride[s]);
}

__global__ void marks_kernel(CuSeqlensTables t) {
  for (i64 i = blockIdx.x; i < t.count; i += gridDim.x) {
    const i64 oq = t.offs64[i], lq = t.lens64[i], okv = t.kv_offs64[i], lkv = t.kv_own64[i];
    for (i64 j = threadIdx.x; j < lq; j += blockDim.x) t.q_marks[oq + j] = 1;
    for (i64 j = threadIdx.x; j < lkv; j += blockDim.x) t.kv_marks[okv + j] = 1;
  }
}

__global__ void zero_unmarked_kernel(unsigned short* base, i64 stride_s, i64 stride_h, i64 heads, i64 d,
                                     const std::uint8_t* marks, i64 tokens) {
  const i64 warps = i64(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (i64 t = (i64(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < tokens; t += warps) {
    if (marks[t]) continue;
    for (i64 e = lane; e < heads * d; e += 32) base[t * stride_s + (e / d) * stride_h + e % d] = 0;  // +0.0
  }
}

__global__ void lse_fill_unmarked_kernel(float* lse, i64 stride_h, i64 stride_s, i64 heads, const std::uint8_t* marks,
                                         i64 tokens) {
  const i64 total = tokens * heads;
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += i64(gridDim.x) * blockDim.x) {
    const i64 t = i / heads;
    if (!marks[t]) lse[(i % heads) * stride_h + t * stride_s] = -INFINITY;
  }
}

}  // namespace

std::size_t cu_seqlens_bytes(std::int64_t count, std::int64_t q_tokens, std::int64_t kv_tokens, int slots) {
  const std::size_t n = std::size_t(count > 0 ? count : 0);
  return 2 * up(n * 4) + up(std::size_t(slots) * (n + 1) * 4) + 4 * up(n * 8) + up(std::size_t(q_tokens)) +
         up(std::size_t(kv_tokens));
}

void cu_seqlens_layout(void* base, CuSeqlensTables* t) {
  auto* p = static_cast<unsigned char*>(base);
  const std::size_t n = std::size_t(t->count);
  auto take = [&](std::size_t bytes) {
    unsigned char* at = p;
    p += up(bytes);
    return at;
  };
  t->seq_q = reinterpret_cast<std::int32_t*>(take(n * 4));
  t->seq_kv = reinterpret_cast<std::int32_t*>(take(n * 4));
  t->ragged = reinterpret_cast<std::int32_t*>(take(std::size_t(t->slots) * (n + 1) * 4));
  t->lens64 = reinterpret_cast<std::int64_t*>(take(n * 8));
  t->offs64 = reinterpret_cast<std::int64_t*>(take(n * 8));
  t->kv_offs64 = reinterpret_cast<std::int64_t*>(take(n * 8));
  t->kv_own64 = reinterpret_cast<std::int64_t*>(take(n * 8));
  t->q_marks = take(std::size_t(t->q_tokens));
  t->kv_marks = take(std::size_t(t->kv_tokens));
}

std::string convert_cu_seqlens(const CuSeqlensTables& t, void* stream) {
  if (t.count <= 0) return {};
  auto s = static_cast<cudaStream_t>(stream);
  // The marks are contiguous (q then kv, 256-byte pieces): one memset clears both.
  const std::size_t marks = std::size_t(t.kv_marks - t.q_marks) + std::size_t(t.kv_tokens);
  if (cudaError_t e = cudaMemsetAsync(t.q_marks, 0, marks, s); e != cudaSuccess)
    return std::string("clearing the token marks: ") + cudaGetErrorString(e);
  tables_kernel<<<1, kThreads, 0, s>>>(t);
  if (auto e = last_error("cu_seqlens tables kernel"); !e.empty()) return e;
  const i64 grid = t.count < 4096 ? t.count : 4096;
  marks_kernel<<<static_cast<int>(grid), kThreads, 0, s>>>(t);
  return last_error("cu_seqlens marks kernel");
}

std::string zero_unmarked_tokens(void* base, std::int64_t stride_s, std::int64_t stride_h, std::int64_t heads,
                                 std::int64_t d, const std::uint8_t* marks, std::int64_t tokens, void* stream) {
  if (tokens <= 0 || heads <= 0 || d <= 0) return {};
  zero_unmarked_kernel<<<blocks_for(tokens * 32), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<unsigned short*>(base), stride_s, stride_h, heads, d, marks, tokens);
  return last_error("zero_unmarked_tokens kernel");
}

std::string lse_fill_unmarked_tokens(float* lse, std::int64_t stride_h, std::int64_t stride_s, std::int64_t heads,
                                     const std::uint8_t* marks, std::int64_t tokens, void* stream) {
  if (tokens <= 0 || heads <= 0) return {};
  lse_fill_unmarked_kernel<<<blocks_for(tokens * heads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      lse, stride_h, stride_s, heads, marks, tokens);
  return last_error("lse_fill_unmarked_tokens kernel");
}

}  // namespace strideattn::detail::cudnn
