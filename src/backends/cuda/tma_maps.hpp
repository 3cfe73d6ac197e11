// TMA tensor maps of the warp-specialized kernels (sm90/ws_params.hpp): when a view can be
// read by TMA (a pure rule, which make_cuda_plan applies), building its map from the view's
// real strides once per plan, and patching each run's data pointers into a copy of the maps.
// The driver's cuTensorMapEncodeTiled and cuTensorMapReplaceAddress are reached through the
// runtime's cudaGetDriverEntryPointByVersion, so the library links no driver library; both
// are host-only computations (no synchronisation, no allocation, no device access).
#pragma once

#include <string>

#include "backends/cuda/sm90/ws_params.hpp"
#include "problem/problem.hpp"

namespace strideattn::cuda_impl {

// Why TMA cannot read view `name` as a (d, token, head, batch) tensor with boxes of
// `box_rows` tokens x 64 columns, or "" when it can: the data pointer (as the plan assumes
// it: a null one counts as 16-byte aligned, the run checks that) and every token, head and
// batch stride of an extent > 1 dimension a positive multiple of 16 bytes below 2^40 bytes,
// extents that fit TMA's int32 coordinates. Pure: no CUDA call.
[[nodiscard]] std::string tma_view_refusal(const TensorView& view, const char* name);

// The maps of Q, K and V of a forward problem (boxes of `q_rows` / `kv_rows` tokens x 64
// columns, 128-byte swizzle, zero fill out of bounds), with placeholder addresses; "" on
// success, else the driver's refusal. Each view must pass tma_view_refusal.
[[nodiscard]] std::string encode_forward_maps(const detail::Problem& problem, int q_rows, int kv_rows,
                                              TmaForwardMaps* maps);

// The maps of Q, K, V and dO of a backward problem (Q and dO in boxes of `q_rows` tokens, K
// and V of `kv_rows`, 64 columns, as encode_forward_maps's); "" on success, else the driver's
// refusal. Each view must pass tma_view_refusal.
[[nodiscard]] std::string encode_backward_maps(const detail::Problem& problem, int q_rows, int kv_rows,
                                               TmaBackwardMaps* maps);

// `maps` with the run's data pointers of Q, K, V and dO; as patch_forward_maps.
[[nodiscard]] std::string patch_backward_maps(TmaBackwardMaps* maps, const void* q, const void* k, const void* v,
                                              const void* d_o);

// `maps` with the run's data pointers of Q, K and V; "" on success, else why not (a pointer
// the driver refuses: it must be 16-byte aligned, which the run's alignment check ensures).
[[nodiscard]] std::string patch_forward_maps(TmaForwardMaps* maps, const void* q, const void* k, const void* v);

}  // namespace strideattn::cuda_impl
