// Checks that each tensor pointer of a call lives where `args.memory` says, so a device
// pointer passed as host memory (or the reverse) is refused with a clear error instead of
// being dereferenced on the wrong side. The pointer query is cudaPointerGetAttributes (no
// synchronisation) in CUDA builds; CPU-only builds have no device pointers and skip it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "strideattn/kv_cache.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::detail {

enum class PointerKind {
  unknown,      // no CUDA runtime in this build, no GPU, or the query failed: not checked
  host,         // ordinary (unregistered) host memory
  pinned_host,  // page-locked host memory (reachable from both sides)
  device,
  managed,  // unified memory (reachable from both sides)
};

// Defined in the CUDA backend (src/backends/cuda/cuda_backend.cu), part of the GPU module;
// the core reaches it through GpuModule::classify_pointer (src/api.cpp).
[[nodiscard]] PointerKind classify_pointer(const void* ptr);

[[nodiscard]] inline std::string_view to_string(PointerKind kind) {
  switch (kind) {
    case PointerKind::unknown:
      return "unknown";
    case PointerKind::host:
      return "host memory";
    case PointerKind::pinned_host:
      return "pinned host memory";
    case PointerKind::device:
      return "device memory";
    case PointerKind::managed:
      return "managed memory";
  }
  return "unknown";
}

// The error for using a pointer of kind `found` as `memory`, or nullopt when that is fine.
[[nodiscard]] inline std::optional<std::string> memory_mismatch(std::string_view tensor, Memory memory,
                                                                PointerKind found) {
  const bool host = memory == Memory::host;
  const bool ok = found == PointerKind::unknown || found == PointerKind::managed || found == PointerKind::pinned_host ||
                  (host ? found == PointerKind::host : found == PointerKind::device);
  if (ok) return std::nullopt;
  const bool pointer = tensor.ends_with("_ptr");  // a pointer of its own (dropout's seed, offset)
  return std::string(tensor) + (pointer ? "" : ".data") + " points to " + std::string(to_string(found)) +
         " but memory is " + (host ? "host" : "device") + "; pass memory = " + (host ? "device" : "host") +
         " for these tensors, or copy them to " + (host ? "the host" : "the device");
}

using PointerClassifier = PointerKind (*)(const void* ptr);

namespace memory_check_impl {
struct Named {
  const char* name;
  const void* ptr;
};
template <std::size_t N>
Status check(const Named (&list)[N], Memory memory, PointerClassifier classify) {
  for (const Named& t : list) {
    if (!t.ptr) continue;  // absent optional tensors (LSE, workspace); validation covers the rest
    if (auto err = memory_mismatch(t.name, memory, classify(t.ptr))) return Status(StatusCode::invalid_argument, *err);
  }
  return Status::Ok();
}
// Dropout's seed and offset pointers, read by the kernels (in the tensors' memory); checked
// only when dropout is on.
inline const void* dropout_seed(const AttentionOptions& o) { return o.dropout.p > 0 ? o.dropout.seed_ptr : nullptr; }
inline const void* dropout_offset(const AttentionOptions& o) {
  return o.dropout.p > 0 ? o.dropout.offset_ptr : nullptr;
}
}  // namespace memory_check_impl

// Also the varlen cu_seqlens arrays and dropout's seed and offset pointers, which live in
// the tensors' memory.
[[nodiscard]] inline Status check_memory(const ForwardArgs& a, PointerClassifier classify) {
  const memory_check_impl::Named list[] = {{"q", a.q.data},
                                           {"k", a.k.data},
                                           {"v", a.v.data},
                                           {"o", a.o.data},
                                           {"lse", a.lse.data},
                                           {"workspace", a.workspace},
                                           {"cu_seqlens_q", a.varlen.cu_seqlens_q},
                                           {"cu_seqlens_kv", a.varlen.cu_seqlens_kv},
                                           {"seq_offsets_q", a.varlen.seq_offsets_q},
                                           {"seq_offsets_kv", a.varlen.seq_offsets_kv},
                                           {"dropout.seed_ptr", memory_check_impl::dropout_seed(a.options)},
                                           {"dropout.offset_ptr", memory_check_impl::dropout_offset(a.options)}};
  return memory_check_impl::check(list, a.memory, classify);
}

[[nodiscard]] inline Status check_memory(const BackwardArgs& a, PointerClassifier classify) {
  const memory_check_impl::Named list[] = {{"q", a.q.data},
                                           {"k", a.k.data},
                                           {"v", a.v.data},
                                           {"o", a.o.data},
                                           {"d_o", a.d_o.data},
                                           {"lse", a.lse.data},
                                           {"dq", a.dq.data},
                                           {"dk", a.dk.data},
                                           {"dv", a.dv.data},
                                           {"workspace", a.workspace},
                                           {"cu_seqlens_q", a.varlen.cu_seqlens_q},
                                           {"cu_seqlens_kv", a.varlen.cu_seqlens_kv},
                                           {"seq_offsets_q", a.varlen.seq_offsets_q},
                                           {"seq_offsets_kv", a.varlen.seq_offsets_kv},
                                           {"dropout.seed_ptr", memory_check_impl::dropout_seed(a.options)},
                                           {"dropout.offset_ptr", memory_check_impl::dropout_offset(a.options)}};
  return memory_check_impl::check(list, a.memory, classify);
}

// KV-cache attention: the views, and the int32 arrays the kernels read (on a GPU backend, a host
// array passed as device memory would be dereferenced by the device).
[[nodiscard]] inline Status check_memory(const KvCacheArgs& a, PointerClassifier classify) {
  const memory_check_impl::Named list[] = {{"q", a.q.data},
                                           {"k_cache", a.k_cache.data},
                                           {"v_cache", a.v_cache.data},
                                           {"k_new", a.k_new.data},
                                           {"v_new", a.v_new.data},
                                           {"o", a.o.data},
                                           {"lse", a.lse.data},
                                           {"block_table", a.block_table.data},
                                           {"cache_seqlens", a.cache_seqlens},
                                           {"seqlens_q", a.seqlens_q},
                                           {"workspace", a.workspace}};
  return memory_check_impl::check(list, a.memory, classify);
}

}  // namespace strideattn::detail
