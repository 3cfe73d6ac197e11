// strideattn._ext, KV-cache attention (strideattn/kv_cache.hpp): forward_kvcache and
// explain_kvcache over DLPack tensors, read as pointers plus their own strides like the other
// bindings. The caches are taken writable when new tokens are appended (they are written in
// place, FlashAttention's flash_attn_with_kvcache) and read-only otherwise; the block table,
// cache_seqlens and seqlens_q are int32 arrays on the tensors' device, handed to the library
// as they are (nothing is copied or read here). No plan cache: every call validates.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ext_common.hpp"
#include "strideattn/kv_cache.hpp"

namespace strideattn::pyext {

namespace {

bool is_int32(nb::dlpack::dtype t) {
  return t.lanes == 1 && t.bits == 32 && static_cast<nb::dlpack::dtype_code>(t.code) == nb::dlpack::dtype_code::Int;
}

// A tensor of a KV-cache call: 4 dimensions only (no varlen form).
template <class Array>
Status to_view4(const char* name, const Array& a, const char* dims, Placement* p, TensorView* out) {
  if (a.ndim() != 4)
    return bad(std::string(name) + " has " + std::to_string(a.ndim()) + " dimensions; supported: 4 (" + dims + ")");
  return to_view(name, a, p, out);
}

// cache_seqlens / seqlens_q: int32 [b], unit stride, on the call's device.
Status lengths_array(const char* name, const InArray& a, std::int64_t batch, Placement* p, const std::int32_t** out) {
  if (Status s = place(name, a, p); !s.ok()) return s;
  if (!is_int32(a.dtype()))
    return bad(std::string(name) + " has dtype " + dtype_name(a.dtype()) + "; supported: int32");
  if (a.ndim() != 1)
    return bad(std::string(name) + " has " + std::to_string(a.ndim()) + " dimensions; supported: 1 ([batch])");
  if (std::int64_t(a.shape(0)) != batch)
    return bad(std::string(name) + " has " + std::to_string(a.shape(0)) + " entries; supported: one per sequence (" +
               std::to_string(batch) + ", q's batch)");
  if (a.shape(0) > 1 && a.stride(0) != 1)
    return bad(std::string(name) + " has stride " + std::to_string(a.stride(0)) + "; supported: 1 (contiguous)");
  *out = static_cast<const std::int32_t*>(a.data());
  return Status::Ok();
}

// The block table: int32 [b, max_pages], any strides (checked against b by the library).
Status block_table_view(const InArray& a, Placement* p, BlockTableView* out) {
  if (Status s = place("block_table", a, p); !s.ok()) return s;
  if (!is_int32(a.dtype())) return bad("block_table has dtype " + dtype_name(a.dtype()) + "; supported: int32");
  if (a.ndim() != 2)
    return bad("block_table has " + std::to_string(a.ndim()) + " dimensions; supported: 2 ([batch, max_pages])");
  out->data = static_cast<const std::int32_t*>(a.data());
  for (std::size_t i = 0; i < 2; ++i) {
    out->shape[i] = std::int64_t(a.shape(i));
    out->stride[i] = a.stride(i);
  }
  return Status::Ok();
}

// A cache: writable when the call appends to it, else read-only. The array is kept in `hold`
// (or `hold_ro`) for the call.
Status cache_view(const char* name, const nb::object& obj, bool appends, const char* dims, Placement* p, OutArray* hold,
                  InArray* hold_ro, TensorView* out) {
  if (appends) {
    if (!nb::try_cast<OutArray>(obj, *hold, false))
      return bad(std::string(name) +
                 " is not a writable DLPack tensor; new tokens (k, v) are written into the caches in place, so "
                 "they must be writable arrays of the tensors' device");
    return to_view4(name, *hold, dims, p, out);
  }
  if (!nb::try_cast<InArray>(obj, *hold_ro, false))
    return bad(std::string(name) + " is not a DLPack tensor; supported: numpy, torch, cupy, jax arrays");
  return to_view4(name, *hold_ro, dims, p, out);
}

struct KvArrays {
  OutArray k_cache, v_cache;
  InArray k_cache_ro, v_cache_ro;
};

Status build_kvcache(const InArray& q, const nb::object& k_cache, const nb::object& v_cache, const OutArray& o,
                     const std::optional<OutArray>& lse, const InArray& cache_seqlens,
                     const std::optional<InArray>& k_new, const std::optional<InArray>& v_new,
                     const std::optional<InArray>& block_table, const std::optional<InArray>& seqlens_q,
                     const std::string& mask, std::int64_t wl, std::int64_t wr, std::optional<double> scale,
                     const std::string& backend, std::uintptr_t stream, KvArrays* hold, KvCacheArgs* args) {
  Placement p;
  const bool appends = k_new.has_value() || v_new.has_value();
  const char* cache_dims = block_table ? "[num_pages, page_size, kv_heads, head_dim], a paged cache"
                                       : "[batch, seq_max, kv_heads, head_dim], a contiguous cache";
  if (Status s = to_view4("q", q, "[batch, seq_q, heads, head_dim]", &p, &args->q); !s.ok()) return s;
  if (Status s =
          cache_view("k_cache", k_cache, appends, cache_dims, &p, &hold->k_cache, &hold->k_cache_ro, &args->k_cache);
      !s.ok())
    return s;
  if (Status s =
          cache_view("v_cache", v_cache, appends, cache_dims, &p, &hold->v_cache, &hold->v_cache_ro, &args->v_cache);
      !s.ok())
    return s;
  if (appends && (!k_new || !v_new))
    return bad(std::string(k_new ? "k" : "v") + " is given without " + (k_new ? "v" : "k") +
               "; supported: both new-token tensors k and v, or neither");
  if (k_new)
    if (Status s = to_view4("k", *k_new, "[batch, seq_new, kv_heads, head_dim]", &p, &args->k_new); !s.ok()) return s;
  if (v_new)
    if (Status s = to_view4("v", *v_new, "[batch, seq_new, kv_heads, head_dim]", &p, &args->v_new); !s.ok()) return s;
  if (Status s = to_view4("out", o, "[batch, seq_q, heads, head_dim_v]", &p, &args->o); !s.ok()) return s;
  if (lse) {
    if (lse->ndim() != 3)
      return bad("lse has " + std::to_string(lse->ndim()) + " dimensions; supported: 3 ([batch, heads, seq_q])");
    if (Status s = to_lse("lse", *lse, &p, &args->lse); !s.ok()) return s;
  }
  if (block_table)
    if (Status s = block_table_view(*block_table, &p, &args->block_table); !s.ok()) return s;
  const std::int64_t batch = args->q.shape[0];
  if (Status s = lengths_array("cache_seqlens", cache_seqlens, batch, &p, &args->cache_seqlens); !s.ok()) return s;
  if (seqlens_q)
    if (Status s = lengths_array("seqlens_q", *seqlens_q, batch, &p, &args->seqlens_q); !s.ok()) return s;
  args->memory = memory_of(p);
  if (Status s = parse_options(mask, wl, wr, scale, false, &args->options); !s.ok()) return s;
  if (Status s = parse_backend(backend, &args->backend); !s.ok()) return s;
  args->stream = reinterpret_cast<void*>(stream);
  return Status::Ok();
}

// Rough FLOPs: every query row against the cache's full capacity.
double kvcache_flops(const KvCacheArgs& a) {
  const double capacity =
      a.block_table.data ? double(a.block_table.shape[1]) * double(a.k_cache.shape[1]) : double(a.k_cache.shape[1]);
  return 2.0 * double(a.q.shape[0]) * double(a.q.shape[1]) * double(a.q.shape[2]) * capacity *
         double(a.q.shape[3] + a.v_cache.shape[3]);
}

}  // namespace

// Tensors first, then the options as keywords (the same names and defaults for both calls).
#define STRIDEATTN_KV_PARAMS                                                                                         \
  InArray q, nb::object k_cache, nb::object v_cache, OutArray o, std::optional<OutArray> lse, InArray cache_seqlens, \
      std::optional<InArray> k_new, std::optional<InArray> v_new, std::optional<InArray> block_table,                \
      std::optional<InArray> seqlens_q, std::string mask, std::int64_t wl, std::int64_t wr,                          \
      std::optional<double> scale, std::string backend, std::uintptr_t stream
#define STRIDEATTN_KV_VALUES \
  q, k_cache, v_cache, o, lse, cache_seqlens, k_new, v_new, block_table, seqlens_q, mask, wl, wr, scale, backend, stream
#define STRIDEATTN_KV_ARGS                                                                                            \
  nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"), nb::arg("lse").none(),                        \
      nb::arg("cache_seqlens"), nb::arg("k").none() = nb::none(), nb::arg("v").none() = nb::none(),                   \
                                nb::arg("block_table").none() = nb::none(), nb::arg("seqlens_q").none() = nb::none(), \
                                nb::arg("mask") = "none", nb::arg("window_left") = -1, nb::arg("window_right") = -1,  \
                                nb::arg("scale") = nb::none(), nb::arg("backend") = "auto", nb::arg("stream") = 0

void bind_kvcache(nb::module_& m) {
  m.def(
      "forward_kvcache",
      [](STRIDEATTN_KV_PARAMS) -> Result {
        KvCacheArgs args;
        KvArrays hold;
        if (Status s = build_kvcache(STRIDEATTN_KV_VALUES, &hold, &args); !s.ok()) return result(s);
        return result(
            run_interruptible(args, kvcache_flops(args), [](const KvCacheArgs& a) { return forward_with_kvcache(a); }));
      },
      STRIDEATTN_KV_ARGS);

  m.def(
      "explain_kvcache",
      [](STRIDEATTN_KV_PARAMS) -> nb::dict {
        KvCacheArgs args;
        KvArrays hold;
        if (Status s = build_kvcache(STRIDEATTN_KV_VALUES, &hold, &args); !s.ok()) {
          Explanation ex;
          ex.validation = s;
          return explanation_dict(ex);
        }
        return explanation_dict(strideattn::explain(args));
      },
      STRIDEATTN_KV_ARGS);
}

}  // namespace strideattn::pyext
