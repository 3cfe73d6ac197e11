// sm_90a asynchronous-copy and synchronisation primitives of the warp-specialized kernels,
// as hand-written PTX: shared-memory mbarriers (init, arrive, arrive with an expected
// transaction count, try_wait on a phase parity), TMA tile loads (cp.async.bulk.tensor,
// completing on an mbarrier), warpgroup register reallocation (setmaxnreg) and the fences
// around them. Everything compiles to nothing outside sm_90a code (SA_WGMMA == 0, wgmma.cuh).
//
// The pipeline protocol the kernels build from these (sm90/ws_forward.cuh,
// sm90/ws_backward.cuh): a `full` barrier per ring stage that the producer arms with the
// stage's byte count (expect_tx) and the TMA completes, and an `empty` barrier per stage on
// which every consumer warp arrives once it is done reading the stage. Both sides track the
// phase parity of each barrier (round r of a stage waits for parity r & 1 on `full`; the
// producer waits for (r & 1) ^ 1 on `empty`, which a fresh barrier satisfies at once, so the
// first round needs no arrival).
#pragma once

#include <cstdint>

#include "backends/cuda/sm90/wgmma.cuh"

namespace strideattn::cuda_impl {

// `count` arrivals complete a phase (plus, for a barrier armed by expect_tx, the bytes).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if SA_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// After the inits of one thread, before the barrier that publishes them: makes them visible
// to the other threads and to the async proxy (the TMA's complete_tx).
__device__ __forceinline__ void mbar_init_fence() {
#if SA_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// One arrival, and `bytes` more expected from asynchronous copies in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if SA_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if SA_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Until the phase of parity `parity` of the barrier has completed (try_wait suspends the
// thread for a hardware-chosen time before it reports, so the loop does not spin hot).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if SA_WGMMA
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

// A box of a 4-dimensional tensor map (d, token, head, batch) at coordinates (c0..c3, in
// elements; out-of-bounds elements read as zero) into shared memory at `dst`, completing
// `bar`'s expected transactions by the box's bytes. `map` is the generic address of a
// CUtensorMap in parameter (__grid_constant__), constant or global memory.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
#if SA_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}

// Brings a tensor map's descriptor into the cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
#if SA_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Register reallocation of a whole warpgroup (every warp of it must execute the same one):
// the producer gives registers back, the consumers take them. N: a multiple of 8 in 24..256.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if SA_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if SA_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// A barrier of `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
// __syncthreads'): the consumer warpgroups' own synchronisation, without the producer.
// named_barrier_arrive counts the calling warps in without waiting for the others.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#if SA_WGMMA
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
#if SA_WGMMA
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

}  // namespace strideattn::cuda_impl
