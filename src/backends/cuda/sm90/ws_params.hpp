// The parameter blocks of the warp-specialized sm_90a kernels (sm90/ws_forward.cuh,
// sm90/ws_backward.cuh): the TMA tensor maps of their inputs (Q, K, V; the backward's dO
// too; 128-byte CUtensorMap descriptors, built on the host from the views' real strides by
// tma_maps.cpp, their addresses patched per run) ahead of the KernelParams every kernel
// receives. Passed by value as one __grid_constant__ kernel parameter, so the maps live in
// parameter memory, where cp.async.bulk.tensor reads them: no descriptor in device memory,
// no copy on the call path.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing of the driver library is linked)

#include "backends/cuda/common/kernel_params.hpp"

namespace strideattn::cuda_impl {

// One map per input view, each 4-dimensional (d, token, head, batch) with the view's own
// token, head and batch strides; boxes of WsForwardTile::box_cols columns x (queries or keys
// of a block) rows, 128-byte swizzled.
struct TmaForwardMaps {
  CUtensorMap q, k, v;
};

struct WsForwardParams {
  TmaForwardMaps maps;
  KernelParams kp;
};
static_assert(alignof(WsForwardParams) >= 64, "tensor maps are 64-byte aligned");
static_assert(sizeof(WsForwardParams) <= 4096, "a kernel parameter block of at most 4 KiB");

// The warp-specialized dK/dV pass (sm90/ws_backward.cuh): Q and dO with boxes of the block's
// queries, K and V with boxes of the CTA's keys, each WsBackwardTile::box_cols columns wide.
struct TmaBackwardMaps {
  CUtensorMap q, k, v, d_o;
};

struct WsBackwardParams {
  TmaBackwardMaps maps;
  KernelParams kp;
};
static_assert(alignof(WsBackwardParams) >= 64, "tensor maps are 64-byte aligned");
static_assert(sizeof(WsBackwardParams) <= 4096, "a kernel parameter block of at most 4 KiB");

}  // namespace strideattn::cuda_impl
