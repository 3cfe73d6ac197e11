// Support rules of the `cudnn` backend: a flat list of named checks, each returning the value
// found and the values supported, with cuDNN version gates read at run time. The rules take
// the device facts as an argument (no GPU call inside), so tests can run them with faked
// devices and versions. Also the mapping of our mask + window onto cuDNN's diagonal band.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/cudnn/graph.hpp"
#include "dispatch/backend.hpp"

namespace strideattn::detail::cudnn {

struct DeviceInfo {
  bool gpu = false;                // a CUDA device is usable
  std::string gpu_error;           // why not, when !gpu
  int sm = 0;                      // compute capability major*10 + minor, e.g. 90
  std::int64_t cudnn_version = 0;  // cudnnGetVersion(), e.g. 91900
};

// The facts of the current device and loaded cuDNN (queried once, cached).
[[nodiscard]] const DeviceInfo& current_device_info();

// Every static rule, in order. The last rule of the backend (graph acceptance) is added by
// the backend itself because it needs the GPU.
[[nodiscard]] std::vector<SupportRule> support_rules(const DeviceInfo& device);

// Our mask + window as cuDNN's diagonal band, or nullopt with the reason it does not map.
[[nodiscard]] std::optional<Band> band_for(const Problem& problem, std::string* why_not);

// A bias (or dBias) view as cuDNN's [b, h, s_q, s_kv] tensor: a dimension of extent 1 or of
// stride 0 (the same elements for every index) becomes extent 1, which cuDNN broadcasts; the
// stride of such a dimension is never used and is given the view's span.
[[nodiscard]] TensorLayout bias_layout_of(const BiasView& view);

// "9.19.0" from 91900.
[[nodiscard]] std::string version_string(std::int64_t version);

// Per-sequence lengths (dense: every sequence has s_q / s_kv; cu_seqlens arrays not read on the
// host: the bounds max_seqlen_q / kv).
[[nodiscard]] std::int64_t seq_len_q(const Problem& p, std::int64_t b);
[[nodiscard]] std::int64_t seq_len_kv(const Problem& p, std::int64_t b);

}  // namespace strideattn::detail::cudnn
