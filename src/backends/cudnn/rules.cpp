// Support rules of the `cudnn` backend (see rules.hpp). Limits come from the cuDNN frontend's
// own support surface (sdpa_support_surface.h, scaled_dot_product_flash_attention.h of
// frontend 1.32) for fp16/bf16 SDPA; each rule says the value found and what is supported.
#include "backends/cudnn/rules.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <tuple>

#include "common/attention_math.hpp"
#include "dispatch/select.hpp"
#include "problem/kv_cache.hpp"

namespace strideattn::detail::cudnn {

namespace {

using Check = std::optional<std::string>;
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

std::string str(std::int64_t x) { return std::to_string(x); }

struct NamedView {
  const char* name;
  const TensorView* view;
};

// The tensors cuDNN reads or writes for this problem.
std::vector<NamedView> tensors_of(const Problem& p) {
  std::vector<NamedView> v{{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"o", &p.o}};
  if (p.is_backward()) {
    v.push_back({"do", &p.d_o});
    v.push_back({"dq", &p.dq});
    v.push_back({"dk", &p.dk});
    v.push_back({"dv", &p.dv});
  }
  return v;
}

kernel::MaskRule mask_of(const Problem& p, std::int64_t b) {
  kernel::MaskRule m;
  m.s_q = seq_len_q(p, b);
  m.s_kv = seq_len_kv(p, b);
  m.kind = static_cast<int>(p.mask);
  m.left = p.window.left;
  m.right = p.window.right;
  return m;
}

Check check_gpu(const DeviceInfo& d, const Problem&) {
  if (d.gpu) return std::nullopt;
  return "no usable CUDA device (" + d.gpu_error + "); supported: an sm80+ CUDA GPU";
}

Check check_version(const DeviceInfo& d, const Problem&) {
  if (d.cudnn_version >= 90000) return std::nullopt;
  if (d.cudnn_version == 0) return std::string("libcudnn could not be loaded; supported: cuDNN >= 9.0");
  return "cuDNN " + version_string(d.cudnn_version) + "; supported: >= 9.0";
}

Check check_known_bad(const DeviceInfo& d, const Problem&) {
  if (d.cudnn_version == 91000 || d.cudnn_version == 91001)
    return "cuDNN " + version_string(d.cudnn_version) +
           " has known fp16/bf16 SDPA bugs; supported: any 9.x except 9.10.0 and 9.10.1";
  return std::nullopt;
}

// Seen on an H200 with cuDNN 9.19 (fuzz seed 3): the deterministic backward with d_qk != d_v
// returned wrong dQ (176/112: 0.17 vs 0.42; 192/80: 0 vs -1.13). Until a GPU run shows it
// right, refuse it rather than risk a silently wrong gradient; the cuda backend runs these
// problems, deterministically.
Check check_deterministic_mla(const DeviceInfo& d, const Problem& p) {
  if (!p.is_backward() || !p.deterministic || p.d_qk == p.d_v) return std::nullopt;
  return "deterministic backward with d_qk " + str(p.d_qk) + " != d_v " + str(p.d_v) + " gave wrong dQ on cuDNN " +
         version_string(d.cudnn_version) + " in our tests; supported: d_qk == d_v, or deterministic = false";
}

// Seen on an H200 with cuDNN 9.19 (scripts/probe-cudnn): varlen (ragged) problems with d_qk 224
// or 256 and d_v 72 or 128 gave a wrong O, and in the backward dK left columns 128 .. d_qk-1
// unwritten and dQ zero there; the same head dims on dense tensors, d_qk <= 192 with any d_v,
// and d_v >= 192 were right. Refused over the whole band d_qk > 192, d_v < 192 (the pairs
// between were not probed); the cuda backend runs them.
Check check_varlen_wide_qk(const DeviceInfo& d, const Problem& p) {
  if (!p.varlen || p.d_qk <= 192 || p.d_v >= 192) return std::nullopt;
  return "varlen with d_qk " + str(p.d_qk) + " > 192 and d_v " + str(p.d_v) + " < 192 gave wrong results on cuDNN " +
         version_string(d.cudnn_version) + " in our tests; supported with varlen: d_qk <= 192, or d_v >= 192";
}

Check check_arch(const DeviceInfo& d, const Problem&) {
  if (d.sm >= 80) return std::nullopt;
  return "GPU compute capability " + str(d.sm / 10) + "." + str(d.sm % 10) +
         "; supported: >= 8.0 (Ampere, Hopper, Blackwell)";
}

Check check_dtype(const DeviceInfo&, const Problem& p) {
  if (p.dtype == DType::f16 || p.dtype == DType::bf16) return std::nullopt;
  return "dtype " + std::string(to_string(p.dtype)) + "; supported: f16, bf16";
}

Check check_unit_dim_stride(const DeviceInfo&, const Problem& p) {
  for (const auto& t : tensors_of(p))
    if (t.view->shape[kHeadDim] > 1 && t.view->stride[kHeadDim] != 1)
      return std::string("tensor ") + t.name + " head-dim stride " + str(t.view->stride[kHeadDim]) + "; supported: 1";
  return std::nullopt;
}

// cuDNN tensors (and Hopper TMA descriptors) take non-negative strides only; a reversed
// view (a negative stride on a dimension of extent > 1) goes to another backend.
Check check_negative_strides(const DeviceInfo&, const Problem& p) {
  static constexpr const char* dims[4] = {"batch", "seq", "head", "head-dim"};
  for (const auto& t : tensors_of(p))
    for (int i = 0; i < 4; ++i)
      if (t.view->shape[i] > 1 && t.view->stride[i] < 0)
        return std::string("tensor ") + t.name + " " + dims[i] + " stride " + str(t.view->stride[i]) +
               "; supported: >= 0 (cuDNN takes no reversed views)";
  for (int i = 0; i < 3; ++i)
    if ((p.is_backward() || p.writes_lse()) && p.lse.shape[i] > 1 && p.lse.stride[i] < 0)
      return "lse stride " + str(p.lse.stride[i]) + " on dimension " + str(i) +
             "; supported: >= 0 (cuDNN takes no reversed views)";
  return std::nullopt;
}

Check check_head_dim(const DeviceInfo& d, const Problem& p) {
  std::int64_t limit = 128;
  std::string why = "cuDNN on sm" + str(d.sm);
  if (d.sm / 10 == 9) limit = 256;
  if (d.sm / 10 == 8 && d.cudnn_version > 90900) limit = 256;
  for (auto [name, dim] : {std::pair{"d_qk", p.d_qk}, std::pair{"d_v", p.d_v}}) {
    if (dim % 8 != 0) return std::string("head dim ") + name + " = " + str(dim) + "; supported: multiples of 8";
    if (dim > limit)
      return std::string("head dim ") + name + " = " + str(dim) + "; supported: <= " + str(limit) + " (" + why + " " +
             version_string(d.cudnn_version) + ")";
  }
  return std::nullopt;
}

// TMA (Hopper) and vector loads: 16-byte aligned bases and outer strides.
Check check_alignment(const DeviceInfo&, const Problem& p) {
  const std::int64_t esize = static_cast<std::int64_t>(size_of(p.dtype));
  for (const auto& t : tensors_of(p)) {
    auto addr = reinterpret_cast<std::uintptr_t>(t.view->data);
    if (addr % 16 != 0)
      return std::string("tensor ") + t.name + " data pointer is " + str(std::int64_t(addr % 16)) +
             " bytes past a 16-byte boundary; supported: 16-byte aligned (cuDNN's TMA loads)";
    const char* dims[] = {"batch", "seq", "head"};
    for (int i = 0; i < 3; ++i) {
      if (t.view->shape[i] <= 1) continue;  // the stride of a size-1 dimension is never used
      if ((t.view->stride[i] * esize) % 16 != 0)
        return std::string("tensor ") + t.name + " " + dims[i] + " stride " + str(t.view->stride[i]) + " elements (" +
               str(t.view->stride[i] * esize) + " bytes); supported: multiples of 16 bytes (cuDNN's TMA loads)";
    }
  }
  return std::nullopt;
}

Check check_mask_maps(const DeviceInfo&, const Problem& p) {
  std::string why;
  if (band_for(p, &why)) return std::nullopt;
  return why;
}

Check check_bounds_int32(const DeviceInfo&, const Problem& p) {
  for (auto [name, x] : {std::pair{"window left", p.window.left}, std::pair{"window right", p.window.right}})
    if (x >= kInt32Max) return std::string(name) + " " + str(x) + "; supported: < 2^31";
  if (!p.varlen) return std::nullopt;
  // Ragged offsets are int32 element offsets: the largest is the last token's offset.
  for (const auto& t : tensors_of(p)) {
    const std::int64_t last = t.view->shape[kSeq] * t.view->stride[kSeq];
    if (last > kInt32Max)
      return std::string("tensor ") + t.name + " spans " + str(last) +
             " elements along its tokens; supported: < 2^31 (cuDNN int32 ragged offsets)";
  }
  return std::nullopt;
}

// Dense problems with a bottom-right band need s_q <= s_kv (cuDNN refuses the graph without
// a padding mask otherwise).
Check check_bottom_right_shape(const DeviceInfo&, const Problem& p) {
  std::string why;
  auto band = band_for(p, &why);
  if (!band || p.varlen || p.kv_cache != nullptr || !band->bottom_right) return std::nullopt;  // (padding mask)
  if (p.s_q <= p.s_kv) return std::nullopt;
  return "bottom-right aligned mask/window with s_q " + str(p.s_q) + " > s_kv " + str(p.s_kv) +
         "; supported: s_q <= s_kv (or varlen)";
}

Check check_band_versions(const DeviceInfo& d, const Problem& p) {
  std::string why;
  auto band = band_for(p, &why);
  if (!band) return std::nullopt;
  const auto v = d.cudnn_version;
  if (band->has_left && v < 90600) return "sliding window on cuDNN " + version_string(v) + "; supported: cuDNN >= 9.6";
  if (band->bottom_right && v < 90600 && (p.s_q % 64 != 0 || p.s_kv % 64 != 0))
    return "bottom-right mask with s_q " + str(p.s_q) + ", s_kv " + str(p.s_kv) + " on cuDNN " + version_string(v) +
           "; supported: multiples of 64 below cuDNN 9.6";
  if (v == 91400 && band->has_left && !band->has_right && p.s_kv > 1024)
    return "window without a right bound and s_kv " + str(p.s_kv) +
           " > 1024 on cuDNN 9.14.0 (known bug); supported: other cuDNN versions";
  return std::nullopt;
}

Check check_varlen_versions(const DeviceInfo& d, const Problem& p) {
  if (!p.varlen) return std::nullopt;
  if (p.heads != p.kv_heads && d.cudnn_version < 90600)
    return "varlen with GQA (" + str(p.heads) + "/" + str(p.kv_heads) + " heads) on cuDNN " +
           version_string(d.cudnn_version) + "; supported: cuDNN >= 9.6";
  if (p.is_backward() && p.deterministic && (d.sm / 10 == 8 || d.sm / 10 == 12))
    return "deterministic varlen backward on sm" + str(d.sm) + "; supported: sm90/sm100";
  return std::nullopt;
}

// cuDNN graphs cannot have empty dimensions: there must be a query and a key somewhere.
Check check_empty_problem(const DeviceInfo&, const Problem& p) {
  if (p.batch > 0 && p.s_q > 0 && p.s_kv > 0 && p.heads > 0) return std::nullopt;
  return std::string(p.varlen ? "longest sequence" : "sizes") + ": batch " + str(p.batch) + ", s_q " + str(p.s_q) +
         ", s_kv " + str(p.s_kv) + ", heads " + str(p.heads) +
         "; supported: batch, s_q, s_kv and heads >= 1 (cuDNN graphs cannot have empty dimensions)";
}

// The frontend refuses a backward graph of one query and one key (its own check).
Check check_single_token_backward(const DeviceInfo&, const Problem& p) {
  if (!p.is_backward() || p.s_q != 1 || p.s_kv != 1) return std::nullopt;
  return std::string("backward with s_q = s_kv = 1") + (p.varlen ? " (longest sequences)" : "") +
         "; supported: s_q > 1 or s_kv > 1 (the cuDNN frontend's own limit)";
}

// cu_seqlens arrays are read on the device: whatever depends on the lengths must be decided
// without them. Under no mask and the top-left causal mask every row of a sequence with keys
// sees key 0; under a bottom-right mask or a window some row could see none (s_q > s_kv in a
// sequence, or a window past the keys), which cuDNN leaves undefined (check_empty_rows), and
// the causal mask with a window needs s_q == s_kv in every sequence (band_for).
Check check_cu_seqlens_mask(const DeviceInfo&, const Problem& p) {
  if (!p.cu_seqlens || (p.mask != MaskKind::causal_bottom_right && p.window.unbounded())) return std::nullopt;
  return "mask " + std::string(to_string(p.mask)) + " with window " + str(p.window.left) + "," + str(p.window.right) +
         " and lengths in cu_seqlens arrays (read on the device): whether a row sees no key depends on the "
         "lengths; supported with cu_seqlens: mask none or causal without a window (or seqlens lists)";
}

// A query row that sees no key must give O = 0 and LSE = -inf; cuDNN leaves such rows
// undefined, so they are refused. (Whole varlen sequences with no keys are handled: their
// rows are written by the backend like padding.)
Check check_empty_rows(const DeviceInfo&, const Problem& p) {
  if (!p.lengths_known() || p.kv_cache != nullptr)
    return std::nullopt;  // KV cache: kv_kernels.hpp writes them  // cu_seqlens: check_cu_seqlens_mask decided
  const std::int64_t n = p.varlen ? p.batch : std::min<std::int64_t>(p.batch, 1);
  for (std::int64_t b = 0; b < n; ++b) {
    kernel::MaskRule m = mask_of(p, b);
    if (m.s_q == 0 || (p.varlen && m.s_kv == 0)) continue;
    for (std::int64_t i = 0; i < m.s_q; ++i)
      if (m.key_end(i) <= m.key_begin(i))
        return "query row " + str(i) + " of sequence " + str(b) + " (s_q " + str(m.s_q) + ", s_kv " + str(m.s_kv) +
               ", mask " + std::string(to_string(p.mask)) + ", window " + str(p.window.left) + "," +
               str(p.window.right) +
               ") sees no key; supported: every row sees at least one key (cuDNN leaves such "
               "rows undefined)";
  }
  return std::nullopt;
}

// KV-cache attention (kvcache.hpp) uses cuDNN's padding mask with per-sequence lengths and, for
// paged caches, its page tables. The frontend's own checks (sdpa_support_surface.h, frontend
// 1.32): paged caches need cuDNN 9.5, with head dims above 128 more than 9.9; decode (s_q = 1)
// with a mask needs more than 9.9 too; bottom-right masks with padding below 9.6 need lengths
// that are multiples of 64. One floor over all of them: 9.10.2 (9.10.0 and 9.10.1 are refused
// for their SDPA bugs before this rule).
Check check_kv_version(const DeviceInfo& d, const Problem& p) {
  if (p.kv_cache == nullptr || d.cudnn_version >= 91002) return std::nullopt;
  return "KV-cache attention on cuDNN " + version_string(d.cudnn_version) +
         "; supported: cuDNN >= 9.10.2 (paged caches with head dims above 128, and decode with a mask, need it)";
}

// Causal (top-left) with a window needs s_q == L in every sequence (band_for), which depends on
// lengths read on the device.
Check check_kv_mask(const DeviceInfo&, const Problem& p) {
  if (p.kv_cache == nullptr || p.mask != MaskKind::causal || p.window.unbounded()) return std::nullopt;
  return "mask causal (top-left) with window " + str(p.window.left) + "," + str(p.window.right) +
         " in KV-cache attention: cuDNN has one diagonal alignment per graph and whether the two coincide "
         "depends on the lengths (read on the device); supported: causal_bottom_right with a window, or causal "
         "without one";
}

// cuDNN takes the paged cache's maximal attended length as an int; a paged cache without pages
// leaves nothing for the entries no sequence reads (0 in the table cuDNN gets) to point at.
Check check_kv_capacity(const DeviceInfo&, const Problem& p) {
  if (p.kv_cache == nullptr) return std::nullopt;
  if (p.kv_cache->capacity > kInt32Max)
    return "cache capacity " + str(p.kv_cache->capacity) + " tokens per sequence; supported: < 2^31 (cuDNN's int)";
  if (p.kv_cache->paged && p.kv_cache->num_pages < 1)
    return "a paged cache of " + str(p.kv_cache->num_pages) + " pages; supported: at least one page";
  return std::nullopt;
}

// cuDNN's paged-cache load takes power-of-two block sizes only (its graph finalisation says
// "block size needs to be non-zero and a power of 2"; seen on an H200 with cuDNN 9.19 for
// pages of 3 and 200 tokens).
Check check_kv_page_size(const DeviceInfo&, const Problem& p) {
  if (p.kv_cache == nullptr || !p.kv_cache->paged) return std::nullopt;
  const std::int64_t size = p.kv_cache->page_size;
  if (size > 0 && (size & (size - 1)) == 0) return std::nullopt;
  return "page size " + str(size) + " tokens; supported: a power of two (cuDNN's paged attention), or backend cuda";
}

std::string dims4(const Dims4& d) {
  std::string s = "[";
  for (int i = 0; i < 4; ++i) s += (i ? ", " : "") + str(d[std::size_t(i)]);
  return s + "]";
}

// The layout cuDNN can read a bias view in, or why not: extents from bias_layout_of (full or
// broadcast batch and heads, full rows and keys), keys contiguous (the frontend's stride-1
// check on the last dimension), no reversed dimension, and 16-byte aligned data and outer
// strides (cuDNN's vector and TMA loads, as for Q/K/V).
Check bias_view_check(const char* name, const BiasView& v, const Problem& p) {
  const TensorLayout l = bias_layout_of(v);
  const std::string what = std::string(name) + " " + dims4(v.shape) + " strides " + dims4(v.stride);
  if (l.dim[2] != p.s_q || l.dim[3] != p.s_kv)
    return what + " broadcasts over " + (l.dim[2] != p.s_q ? "query rows" : "keys") +
           "; supported: [1 or b, 1 or h, s_q, s_kv] (cuDNN's bias is broadcast over batch and heads only)";
  if (v.dtype != p.dtype)
    return what + " in " + std::string(to_string(v.dtype)) + " with " + std::string(to_string(p.dtype)) +
           " tensors; supported: the tensors' dtype (cuDNN reads the bias in its I/O type)";
  if (v.shape[3] > 1 && v.stride[3] != 1)
    return what + " has key stride " + str(v.stride[3]) + "; supported: 1 (cuDNN's bias is contiguous along keys)";
  const std::int64_t esize = std::int64_t(size_of(v.dtype));
  static constexpr const char* dim_names[3] = {"batch", "head", "row"};
  for (int i = 0; i < 3; ++i) {
    if (l.dim[i] <= 1) continue;
    if (v.stride[i] < 0)
      return what + " has " + dim_names[i] + " stride " + str(v.stride[i]) +
             "; supported: >= 0 (cuDNN takes no reversed views)";
    if ((v.stride[i] * esize) % 16 != 0)
      return what + " has " + dim_names[i] + " stride " + str(v.stride[i]) + " elements (" + str(v.stride[i] * esize) +
             " bytes); supported: multiples of 16 bytes (cuDNN's vector loads)";
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(v.data);
  if (addr % 16 != 0)
    return what + " data pointer is " + str(std::int64_t(addr % 16)) +
           " bytes past a 16-byte boundary; supported: 16-byte aligned";
  return std::nullopt;
}

// cuDNN's SDPA adds a post-scale bias (L = scale Q K^T + B) of shape [1 or b, 1 or h, s_q,
// s_kv] and, in the backward, writes dBias of shape [1, h, s_q, s_kv] only (summed over the
// batch; TransformerEngine keeps the other shapes off cuDNN for the same reason). The
// frontend refuses a bias with a bottom-right diagonal, and with a band's left bound before
// 9.10.2 (sdpa_support_surface.h); our windows are all aligned bottom-right, so a bias goes
// with no mask or the top-left causal mask. A pre-scale bias would need scale * B added, a
// rounded copy of the bias, not the definition's exact sum.
Check check_bias(const DeviceInfo& d, const Problem& p) {
  if (!p.bias_on()) return std::nullopt;
  if (p.bias_type != BiasType::post_scale)
    return std::string(to_string(p.bias_type)) +
           " bias: cuDNN adds its bias after the scale and cannot scale it exactly; supported: post_scale (or "
           "pre_scale on the reference, cpu and cuda backends)";
  if (p.kv_cache != nullptr || p.varlen)
    return std::string("post_scale bias with ") + (p.kv_cache != nullptr ? "KV-cache attention" : "varlen tensors") +
           ": this backend passes cuDNN a bias only with dense tensors; supported: dense q/k/v (or the reference, "
           "cpu and cuda backends)";
  if (p.mask == MaskKind::causal_bottom_right || !p.window.unbounded())
    return "post_scale bias with mask " + std::string(to_string(p.mask)) + " and window " + str(p.window.left) + "," +
           str(p.window.right) +
           ": cuDNN's SDPA takes no bias with a bottom-right aligned diagonal (every window is one); supported with "
           "a bias: mask none or causal without a window (or the reference, cpu and cuda backends)";
  if (auto why = bias_view_check("bias", p.bias, p)) return why;
  if (!p.dbias_on) return std::nullopt;
  // (dBias has the bias's shape; a bias broadcast by a stride 0 still has a dBias per index)
  const TensorLayout l = bias_layout_of(p.dbias);
  if (l.dim[0] != 1 || l.dim[1] != p.heads)
    return "dbias " + dims4(p.dbias.shape) +
           ": cuDNN writes dBias of shape [1, h, s_q, s_kv] only; supported with dbias: a bias [1, " + str(p.heads) +
           ", " + str(p.s_q) + ", " + str(p.s_kv) + "] (or the reference, cpu and cuda backends)";
  // (cuDNN's dBias reduction writes rows at a stride of s_kv: a padded dBias found no engine
  // on an H200, "dbias layout should be row major")
  if (p.dbias.stride[3] != 1 || (p.dbias.shape[2] > 1 && p.dbias.stride[2] != p.dbias.shape[3]))
    return "dbias " + dims4(p.dbias.shape) + " strides " + dims4(p.dbias.stride) +
           ": cuDNN writes dBias in packed rows; supported: key stride 1 and query-row stride " +
           str(p.dbias.shape[3]) + " (or the reference, cpu and cuda backends)";
  if (auto why = bias_view_check("dbias", p.dbias, p)) return why;
  if (d.cudnn_version < 90500 && (p.s_q % 64 != 0 || p.s_kv % 64 != 0))
    return "dbias with s_q " + str(p.s_q) + ", s_kv " + str(p.s_kv) + " on cuDNN " + version_string(d.cudnn_version) +
           "; supported: multiples of 64 below cuDNN 9.5";
  if (p.deterministic && d.sm / 10 == 10)
    return "deterministic backward with dbias on sm" + str(d.sm) +
           " (the cuDNN frontend's own limit); supported: deterministic = false, or sm80/sm90";
  return std::nullopt;
}

// cuDNN's sink token (cuDNN 9.13+, frontend set_sink_token / set_dsink_token): an fp32 [1, h,
// 1, 1] tensor joining every row's softmax denominator, and in the backward its gradient of the
// same shape, summed over batches and rows. The frontend refuses a sink with one query row
// (its decode path) and, before cuDNN 9.26, a backward with ragged offsets and a sink; this
// backend passes sinks with dense tensors only. The views must be contiguous along heads and
// 16-byte aligned (as TransformerEngine passes them).
Check check_sinks(const DeviceInfo& d, const Problem& p) {
  if (!p.sinks_on) return std::nullopt;
  const std::string what =
      std::string("attention sinks [1, ") + str(p.sinks.shape[1]) + "]" + (p.d_sinks_on ? " with d_sinks" : "");
  if (d.cudnn_version < 91300)
    return what + " on cuDNN " + version_string(d.cudnn_version) +
           "; supported: cuDNN >= 9.13 (its sink token), or the reference, cpu and cuda backends";
  if (p.kv_cache != nullptr || p.varlen)
    return what + " with " + (p.kv_cache != nullptr ? "KV-cache attention" : "varlen tensors") +
           ": this backend passes cuDNN a sink only with dense tensors (cuDNN's backward with ragged offsets and "
           "a sink needs 9.26); supported: dense q/k/v (or the reference, cpu and cuda backends)";
  if (p.s_q == 1)
    return what +
           " with s_q 1: cuDNN's single-query path takes no sink (the frontend's own limit); supported: s_q "
           ">= 2 (or the reference, cpu and cuda backends)";
  for (auto [name, view, on] : {std::tuple{"sinks", &p.sinks, true}, std::tuple{"d_sinks", &p.d_sinks, p.d_sinks_on}}) {
    if (!on) continue;
    if (view->shape[1] > 1 && view->stride[1] != 1)
      return std::string(name) + " head stride " + str(view->stride[1]) +
             "; supported: 1 (cuDNN's [1, h, 1, 1] sink tensor, contiguous)";
    const auto addr = reinterpret_cast<std::uintptr_t>(view->data);
    if (addr % 16 != 0)
      return std::string(name) + " data pointer is " + str(std::int64_t(addr % 16)) +
             " bytes past a 16-byte boundary; supported: 16-byte aligned";
  }
  return std::nullopt;
}

}  // namespace

TensorLayout bias_layout_of(const BiasView& v) {
  TensorLayout l;
  std::int64_t span = 1;
  for (int i = 0; i < 4; ++i)
    if (v.shape[i] > 1 && v.stride[i] != 0) span = std::max(span, v.shape[i] * v.stride[i]);
  for (int i = 0; i < 4; ++i) {
    const bool broadcast = v.shape[i] <= 1 || v.stride[i] == 0;
    l.dim[i] = broadcast ? 1 : v.shape[i];
    l.stride[i] = broadcast ? (i == 3 ? 1 : span) : v.stride[i];  // the frontend wants key stride 1
  }
  return l;
}

std::string version_string(std::int64_t v) {
  if (v < 10000)  // cuDNN 8 numbering: major * 1000 + minor * 100 + patch
    return str(v / 1000) + "." + str((v % 1000) / 100) + "." + str(v % 100);
  return str(v / 10000) + "." + str((v / 100) % 100) + "." + str(v % 100);
}

// (cu_seqlens arrays not read on the host: the bounds.)
std::int64_t seq_len_q(const Problem& p, std::int64_t b) {
  return p.varlen && p.lengths_known() ? p.seqlens_q[std::size_t(b)] : p.s_q;
}
std::int64_t seq_len_kv(const Problem& p, std::int64_t b) {
  return p.varlen && p.lengths_known() ? p.seqlens_kv[std::size_t(b)] : p.s_kv;
}

const DeviceInfo& current_device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    d.cudnn_version = runtime_version();
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      d.gpu_error = e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                                     : std::string("no CUDA device found");
      cudaGetLastError();  // clear the sticky-free error state
      return d;
    }
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    d.gpu = true;
    d.sm = major * 10 + minor;
    return d;
  }();
  return info;
}

std::optional<Band> band_for(const Problem& p, std::string* why_not) {
  Band band;
  const bool window = !p.window.unbounded();
  if (p.mask == MaskKind::none && !window) return band;
  if (p.mask == MaskKind::causal && !window) {
    band.has_right = true;  // j <= i
    return band;
  }
  // Every other combination is aligned bottom-right (our windows always are).
  if (p.mask == MaskKind::causal) {
    // Causal top-left and a bottom-right window need one alignment: only when s_q == s_kv
    // in every sequence do the two diagonals coincide.
    for (std::int64_t b = 0; b < p.batch; ++b) {
      if (seq_len_q(p, b) != seq_len_kv(p, b)) {
        *why_not = "causal (top-left) mask with a window (" + str(p.window.left) + "," + str(p.window.right) +
                   ") and s_q " + str(seq_len_q(p, b)) + " != s_kv " + str(seq_len_kv(p, b)) + " in sequence " +
                   str(b) +
                   "; cuDNN has one diagonal alignment per graph; supported: s_q == s_kv, or "
                   "mask causal-bottom-right";
        return std::nullopt;
      }
      if (!p.varlen) break;
    }
  }
  band.bottom_right = true;
  // Right edge: j <= i + shift + right, and causal clamps it to right <= 0.
  if (p.mask != MaskKind::none) {
    band.has_right = true;
    band.right_bound = 0;
  } else if (p.window.right >= 0) {
    band.has_right = true;
    band.right_bound = p.window.right;
  }
  // Left edge: ours is j >= i + shift - left; cuDNN's is j > i + shift - left_bound.
  if (p.window.left >= 0) {
    band.has_left = true;
    band.left_bound = p.window.left + 1;
  }
  return band;
}

std::vector<SupportRule> support_rules(const DeviceInfo& device) {
  auto rule = [&device](const char* name, Check (*fn)(const DeviceInfo&, const Problem&)) {
    return SupportRule{name, [device, fn](const Problem& p) { return fn(device, p); }};
  };
  return with_feature_rules(Backend::cudnn, {
                                                memory_rule(Memory::device),
                                                rule("gpu", check_gpu),
                                                rule("cudnn_version", check_version),
                                                rule("cudnn_known_bug", check_known_bad),
                                                rule("kv_cache_version", check_kv_version),
                                                rule("gpu_arch", check_arch),
                                                rule("dtype", check_dtype),
                                                rule("empty_problem", check_empty_problem),
                                                rule("single_token_backward", check_single_token_backward),
                                                rule("head_dim_stride", check_unit_dim_stride),
                                                rule("negative_stride", check_negative_strides),
                                                rule("head_dim", check_head_dim),
                                                rule("cu_seqlens_mask", check_cu_seqlens_mask),
                                                rule("deterministic_mla", check_deterministic_mla),
                                                rule("alignment", check_alignment),
                                                rule("kv_cache_mask", check_kv_mask),
                                                rule("mask_alignment", check_mask_maps),
                                                rule("int32_limits", check_bounds_int32),
                                                rule("kv_cache_capacity", check_kv_capacity),
                                                rule("kv_cache_page_size", check_kv_page_size),
                                                rule("empty_rows", check_empty_rows),
                                                rule("bottom_right_shape", check_bottom_right_shape),
                                                rule("band_version", check_band_versions),
                                                rule("varlen_version", check_varlen_versions),
                                                rule("varlen_wide_qk", check_varlen_wide_qk),
                                                rule("bias", check_bias),
                                                rule("sinks", check_sinks),
                                            });
}

}  // namespace strideattn::detail::cudnn
