// run_prefill (decode_host.hpp): a KV-cache call with many query rows through the dense
// forward. The plan (make_decode_plan) is the dense forward's for the call's selection
// problem: Q, O and LSE as given, K and V the caches with s_kv = capacity. Here its kernel
// parameters get the KV-cache part (KernelParams::kv: the length arrays, s_new, capacity and
// for a paged cache the block table and the page size's fast divisor), so the kernels read
// each sequence's lengths from device memory and a paged cache through its block table; the
// append runs first, on the same stream. No host read of the lengths, no synchronisation.
#include <string>

#include "backends/cuda/common/kernel_params.hpp"
#include "backends/cuda/decode/decode_host.hpp"
#include "backends/cuda/launch.hpp"
#include "common/log.hpp"

namespace strideattn::cuda_impl {

Status run_prefill(const detail::KvCacheProblem& p, const DecodePlan& plan, cudaStream_t stream,
                   unsigned char* workspace) {
  if (Status s = run_append(p, stream); !s.ok()) return s;
  const detail::Problem problem = detail::selection_problem(p);
  PreparedLaunch prep = prepare_launch(plan.forward, problem);
  KvCacheParams& kv = prep.params.kv;
  const KvCacheArgs& a = p.args;
  kv.cache_seqlens = a.cache_seqlens;
  kv.seqlens_q = a.seqlens_q;
  kv.s_q = p.s_q;
  kv.s_new = p.s_new;
  kv.capacity = p.capacity;
  if (p.paged) {
    kv.block_table = a.block_table.data;
    kv.bt_b = a.block_table.stride[0];
    kv.bt_p = a.block_table.stride[1];
    kv.num_pages = p.num_pages;
    kv.page = FastDivmod(std::uint32_t(p.page_size));
  }
  if (detail::log_level() >= detail::LogLevel::debug)
    detail::log_line(detail::LogLevel::debug, "cuda kv cache: " + plan.why);
  return launch(prep, problem, stream, workspace);
}

}  // namespace strideattn::cuda_impl
