// Kernels of kv_kernels.hpp: the per-sequence preparation of cuDNN's lengths and page table,
// and the per-row fix-up after the KV-cache graph.
#include <cuda_runtime.h>

#include <cmath>

#include "backends/cudnn/kv_kernels.hpp"

namespace strideattn::detail::cudnn {

namespace {

constexpr int kThreads = 128;
constexpr unsigned kMaxBlocks = 4096;

std::string last_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// One block per sequence (grid-stride). A sequence is broken when its lengths break the
// caller's promises or, paged, when an entry of a page it reads lies outside the pages.
__global__ void __launch_bounds__(kThreads) kv_prepare_kernel(const KvFix f) {
  for (std::int64_t n = blockIdx.x; n < f.batch; n += gridDim.x) {
    const std::int64_t cached = f.cache_seqlens[n];
    const std::int64_t rows = f.seqlens_q != nullptr ? std::int64_t(f.seqlens_q[n]) : f.s_q;
    const bool bad_len = cached < 0 || cached + f.s_new > f.capacity || rows < 0 || rows > f.s_q;
    const std::int64_t length = bad_len ? 0 : cached + f.s_new;
    const std::int64_t used = f.page_size > 0 ? (length + f.page_size - 1) / f.page_size : 0;
    int bad_page = 0;
    for (std::int64_t j = threadIdx.x; j < used; j += blockDim.x) {
      const std::int64_t page = f.block_table[n * f.bt_b + j * f.bt_p];
      bad_page |= page < 0 || page >= f.num_pages;
    }
    const bool broken = bad_len || __syncthreads_or(bad_page) != 0;
    if (f.page_size > 0)
      for (std::int64_t j = threadIdx.x; j < f.max_pages; j += blockDim.x)
        f.table[n * f.max_pages + j] = !broken && j < used ? f.block_table[n * f.bt_b + j * f.bt_p] : 0;
    if (threadIdx.x == 0) {
      const std::int64_t keys = broken ? 0 : length;
      f.seq_kv[n] = std::int32_t(keys);
      f.seq_q[n] = std::int32_t(keys == 0 ? 0 : rows);  // no key: cuDNN gets no row either
      f.broken[n] = broken ? 1 : 0;
    }
    __syncthreads();
  }
}

// One warp per (sequence, head, row), grid-stride.
__global__ void __launch_bounds__(kThreads) kv_finish_kernel(const KvFix f) {
  const std::int64_t warps = std::int64_t(gridDim.x) * (kThreads / 32);
  const std::int64_t rows = f.batch * f.heads * f.s_q;
  const int lane = int(threadIdx.x % 32);
  for (std::int64_t r = blockIdx.x * std::int64_t(kThreads / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const std::int64_t i = r % f.s_q, h = (r / f.s_q) % f.heads, n = r / (f.s_q * f.heads);
    kernel::MaskRule m;
    m.s_q = f.seq_q[n];
    m.s_kv = f.seq_kv[n];
    m.kind = f.mask_kind;
    m.left = f.window_left;
    m.right = f.window_right;
    // 0: keep cuDNN's row; 1: O = 0, LSE = -inf; 2: NaN
    int what = 0;
    float lse = 0.f;
    if (f.broken[n] != 0) {
      what = 2;
    } else if (i >= m.s_q || m.key_end(i) <= m.key_begin(i)) {
      what = 1;
    } else {
      lse = f.stats[r];
      if (!isfinite(lse)) what = 2;
    }
    if (what != 0) {
      const unsigned short bits = what == 1 ? 0 : (f.bf16 ? 0x7FC0 : 0x7E00);
      unsigned short* o = static_cast<unsigned short*>(f.o) + n * f.o_st.b + i * f.o_st.s + h * f.o_st.h;
      for (std::int64_t e = lane; e < f.d_v; e += 32) o[e * f.o_st.d] = bits;
      lse = what == 1 ? -INFINITY : NAN;
    }
    if (lane == 0 && f.lse != nullptr) f.lse[n * f.lse_b + h * f.lse_h + i * f.lse_s] = lse;
  }
}

unsigned blocks_for(std::int64_t work) {
  return unsigned(work < 1 ? 1 : work < std::int64_t(kMaxBlocks) ? work : std::int64_t(kMaxBlocks));
}

}  // namespace

std::string kv_prepare(const KvFix& f, void* stream) {
  if (f.batch <= 0) return {};
  kv_prepare_kernel<<<blocks_for(f.batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(f);
  return last_error("launching the kv-cache length kernel");
}

std::string kv_finish(const KvFix& f, void* stream) {
  const std::int64_t rows = f.batch * f.heads * f.s_q;
  if (rows <= 0) return {};
  kv_finish_kernel<<<blocks_for((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(f);
  return last_error("launching the kv-cache row fix-up kernel");
}

}  // namespace strideattn::detail::cudnn
