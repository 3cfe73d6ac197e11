// TMA tensor maps of the warp-specialized kernels (tma_maps.hpp).
#include "backends/cuda/tma_maps.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>
#include <utility>

#include "problem/run_check.hpp"

namespace strideattn::cuda_impl {

namespace {

constexpr std::int64_t kMaxStrideBytes = std::int64_t(1) << 40;
constexpr std::int64_t kMaxCoordinate = 0x7fffffff;

// The driver functions, looked up once (nullptr where the driver has none).
struct DriverTma {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  PFN_cuTensorMapReplaceAddress_v12000 replace = nullptr;
};
const DriverTma& driver_tma() {
  static const DriverTma fns = [] {
    DriverTma d;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      d.encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapReplaceAddress", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      d.replace = reinterpret_cast<PFN_cuTensorMapReplaceAddress_v12000>(fn);
    (void)cudaGetLastError();  // (a failed lookup must not reach the next call's launch checks)
    return d;
  }();
  return fns;
}

// A placeholder address for maps made before a run's pointers are known (16-byte aligned,
// never dereferenced: each run replaces it).
void* placeholder() { return reinterpret_cast<void*>(std::uintptr_t(1) << 12); }

std::string encode_view(const TensorView& v, int box_rows, CUtensorMap* map) {
  const DriverTma& d = driver_tma();
  if (d.encode == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  const std::int64_t elem = 2;
  // (d, token, head, batch); an extent-1 dimension is never stepped, its stride only has to
  // be one the driver accepts
  const int dims[3] = {kSeq, kHead, kBatch};
  cuuint64_t extent[4] = {cuuint64_t(v.shape[kHeadDim]), 0, 0, 0};
  cuuint64_t stride[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    extent[i + 1] = cuuint64_t(v.shape[dims[i]]);
    stride[i] = v.shape[dims[i]] > 1 ? cuuint64_t(v.stride[dims[i]] * elem) : cuuint64_t(16);
  }
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_step[4] = {1, 1, 1, 1};
  const CUresult r = d.encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, placeholder(), extent, stride, box, element_step,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? "" : "cuTensorMapEncodeTiled returned " + std::to_string(int(r));
}

}  // namespace

std::string tma_view_refusal(const TensorView& v, const char* name) {
  if (detail::alignment_class(v.data) < 16)
    return std::string(name) + ": data pointer not 16-byte aligned (TMA needs 16)";
  if (v.stride[kHeadDim] != 1) return std::string(name) + ": head-dim stride " + std::to_string(v.stride[kHeadDim]);
  const std::int64_t elem = 2;
  const int dims[3] = {kSeq, kHead, kBatch};
  const char* dim_names[3] = {"token", "head", "batch"};
  for (int i = 0; i < 3; ++i) {
    const std::int64_t n = v.shape[dims[i]], st = v.stride[dims[i]] * elem;
    if (n > kMaxCoordinate)
      return std::string(name) + ": " + dim_names[i] + " extent " + std::to_string(n) +
             " above TMA's int32 coordinates";
    if (n > 1 && (st <= 0 || st % 16 != 0 || st >= kMaxStrideBytes))
      return std::string(name) + ": " + dim_names[i] + " stride " + std::to_string(v.stride[dims[i]]) +
             " elements (TMA needs a positive multiple of 16 bytes below 2^40)";
  }
  return "";
}

std::string encode_forward_maps(const detail::Problem& p, int q_rows, int kv_rows, TmaForwardMaps* maps) {
  if (std::string e = encode_view(p.q, q_rows, &maps->q); !e.empty()) return "q: " + e;
  if (std::string e = encode_view(p.k, kv_rows, &maps->k); !e.empty()) return "k: " + e;
  if (std::string e = encode_view(p.v, kv_rows, &maps->v); !e.empty()) return "v: " + e;
  return "";
}

std::string encode_backward_maps(const detail::Problem& p, int q_rows, int kv_rows, TmaBackwardMaps* maps) {
  if (std::string e = encode_view(p.q, q_rows, &maps->q); !e.empty()) return "q: " + e;
  if (std::string e = encode_view(p.k, kv_rows, &maps->k); !e.empty()) return "k: " + e;
  if (std::string e = encode_view(p.v, kv_rows, &maps->v); !e.empty()) return "v: " + e;
  if (std::string e = encode_view(p.d_o, q_rows, &maps->d_o); !e.empty()) return "d_o: " + e;
  return "";
}

std::string patch_backward_maps(TmaBackwardMaps* maps, const void* q, const void* k, const void* v, const void* d_o) {
  const DriverTma& d = driver_tma();
  if (d.replace == nullptr) return "the driver has no cuTensorMapReplaceAddress";
  const std::pair<CUtensorMap*, const void*> all[] = {{&maps->q, q}, {&maps->k, k}, {&maps->v, v}, {&maps->d_o, d_o}};
  for (auto [map, ptr] : all)
    if (const CUresult r = d.replace(map, const_cast<void*>(ptr)); r != CUDA_SUCCESS)
      return "cuTensorMapReplaceAddress returned " + std::to_string(int(r));
  return "";
}

std::string patch_forward_maps(TmaForwardMaps* maps, const void* q, const void* k, const void* v) {
  const DriverTma& d = driver_tma();
  if (d.replace == nullptr) return "the driver has no cuTensorMapReplaceAddress";
  const std::pair<CUtensorMap*, const void*> all[] = {{&maps->q, q}, {&maps->k, k}, {&maps->v, v}};
  for (auto [map, ptr] : all)
    if (const CUresult r = d.replace(map, const_cast<void*>(ptr)); r != CUDA_SUCCESS)
      return "cuTensorMapReplaceAddress returned " + std::to_string(int(r));
  return "";
}

}  // namespace strideattn::cuda_impl
