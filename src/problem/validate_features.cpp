// Validation rules of the training features (docs/semantics.md "Training features", "What is
// rejected (training features)"): softcap and dropout in range, the bias type, and the shape,
// dtype and presence of every feature tensor (bias, dBias, ALiBi slopes, sinks, d_sink, max
// logit) against the problem. Runs after the core rules (sizes are sane by then); nothing here
// dereferences a pointer.
#include <cmath>
#include <cstdio>
#include <string>

#include "problem/validate.hpp"

namespace strideattn::detail {

namespace {

using i64 = std::int64_t;

Status invalid(const std::string& message) { return Status(StatusCode::invalid_argument, message); }

template <std::size_t N>
std::string shape_text(const std::array<i64, N>& a) {
  std::string s = "[";
  for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

constexpr const char* kBiasDims[4] = {"batch", "head", "s_q", "s_kv"};
constexpr const char* kHeadDims[2] = {"rows", "head"};

bool shaped(const BiasView& v) { return v.shape[0] || v.shape[1] || v.shape[2] || v.shape[3]; }
bool given(const BiasView& v) { return v.data != nullptr || shaped(v); }

bool dtype_ok(DType d) { return d == DType::f16 || d == DType::bf16 || d == DType::f32; }

// A bias-like view (bias, dbias) alone, then its extents against the problem.
Status check_bias_view(const Problem& p, const char* name, const BiasView& v, bool deferred) {
  if (!dtype_ok(v.dtype))
    return invalid(std::string(name) + ": dtype " + std::to_string(static_cast<int>(v.dtype)) +
                   " is unknown; supported: f32, f16, bf16");
  if (Status s = check_view_alone(name, v.data, static_cast<i64>(size_of(v.dtype)), v.shape, v.stride, kBiasDims, -1,
                                  deferred);
      !s.ok())
    return s;
  const i64 full[4] = {p.batch, p.heads, p.s_q, p.s_kv};
  for (int d = 0; d < 4; ++d) {
    const i64 x = v.shape[std::size_t(d)];
    // Varlen: rows and columns are positions within a sequence; the bias may be longer.
    const bool ok = x == full[d] || x == 1 || (p.varlen && d >= 2 && x >= full[d]);
    if (!ok)
      return invalid(std::string(name) + ": " + kBiasDims[d] + " extent " + std::to_string(x) + " (shape " +
                     shape_text(v.shape) + "); supported: " + std::to_string(full[d]) + " or 1" +
                     (p.varlen && d >= 2 ? " (varlen: 1 or at least the longest sequence)" : "") +
                     ", logical [b or 1, h or 1, s_q or 1, s_kv or 1]");
  }
  return Status::Ok();
}

// An fp32 [rows, h] table whose rows must be one of `rows_a` / `rows_b`.
Status check_head_view(const Problem& p, const char* name, const HeadView& v, i64 rows_a, i64 rows_b,
                       const char* wanted, bool deferred) {
  if (Status s = check_view_alone(name, v.data, 4, v.shape, v.stride, kHeadDims, -1, deferred); !s.ok()) return s;
  if ((v.shape[0] != rows_a && v.shape[0] != rows_b) || v.shape[1] != p.heads)
    return invalid(std::string(name) + ": shape " + shape_text(v.shape) + "; supported: " + wanted + " = [" +
                   std::to_string(rows_a) + (rows_a != rows_b ? " or " + std::to_string(rows_b) : std::string()) +
                   ", " + std::to_string(p.heads) + "] (fp32)");
  return Status::Ok();
}

}  // namespace

Status check_features(const Problem& p, Pointers mode) {
  const bool deferred = mode == Pointers::deferred;
  if (!std::isfinite(p.softcap) || p.softcap < 0.0)
    return invalid("softcap: " + num(p.softcap) + "; supported: 0 (off) or a finite value > 0");
  if (p.softcap > 0.0 && (p.softcap < 1.1754943508222875e-38 || p.softcap > 3.4028234663852886e38))
    return invalid("softcap: " + num(p.softcap) + "; supported: 0 (off) or a normal fp32 number > 0");
  if (!(p.dropout_p >= 0.0 && p.dropout_p < 1.0))
    return invalid("dropout: p = " + num(p.dropout_p) + "; supported: 0 <= p < 1 (0: no dropout)");
  if (p.dropout_on()) {
    constexpr i64 kMax = i64{1} << 32;
    if (p.s_q >= kMax || p.s_kv >= kMax)
      return invalid("dropout: s_q = " + std::to_string(p.s_q) + ", s_kv = " + std::to_string(p.s_kv) +
                     "; supported with dropout: below 2^32 (the Philox counter holds row and key in 32 bits)");
    for (auto [name, ptr] :
         {std::pair{"dropout.seed_ptr", p.dropout_seed_ptr}, std::pair{"dropout.offset_ptr", p.dropout_offset_ptr}})
      if (reinterpret_cast<std::uintptr_t>(ptr) % 8 != 0)
        return invalid(std::string(name) + " is " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr) % 8) +
                       " bytes past an 8-byte boundary; supported: a uint64 aligned to 8 bytes");
  }

  const int bt = static_cast<int>(p.bias_type);
  if (bt < 0 || bt > 2)
    return invalid("bias_type " + std::to_string(bt) + " is unknown; supported: none, post_scale, pre_scale");
  if (!p.bias_on() && given(p.bias))
    return invalid("bias: a bias view is given (shape " + shape_text(p.bias.shape) +
                   ") but bias_type is none; supported: bias_type post_scale or pre_scale with a bias");
  if (p.bias_on()) {
    if (!given(p.bias) || (!deferred && p.bias.data == nullptr && !shaped(p.bias)))
      return invalid("bias: bias_type is " + std::string(to_string(p.bias_type)) +
                     " but no bias view is given; supported: a bias [b or 1, h or 1, s_q or 1, s_kv or 1]");
    if (Status s = check_bias_view(p, "bias", p.bias, deferred); !s.ok()) return s;
  }
  if (p.dbias_on) {
    if (!p.bias_on()) return invalid("dbias: a dbias view is given but there is no bias; supported: dbias with a bias");
    if (Status s = check_bias_view(p, "dbias", p.dbias, deferred); !s.ok()) return s;
    if (p.dbias.shape != p.bias.shape)
      return invalid("dbias: shape " + shape_text(p.dbias.shape) + " differs from the bias's " +
                     shape_text(p.bias.shape) + "; supported: the bias's logical shape");
  }
  if (p.alibi_on)
    if (Status s = check_head_view(p, "alibi_slopes", p.alibi, 1, p.batch, "[1 or b, h]", deferred); !s.ok()) return s;
  if (p.sinks_on)
    if (Status s = check_head_view(p, "sinks", p.sinks, 1, 1, "[1, h]", deferred); !s.ok()) return s;
  if (p.d_sinks_on) {
    if (!p.sinks_on)
      return invalid("d_sinks: a d_sinks view is given but there are no sinks; supported: d_sinks with sinks");
    if (Status s = check_head_view(p, "d_sinks", p.d_sinks, 1, 1, "[1, h]", deferred); !s.ok()) return s;
  }
  if (p.max_logit_on)
    if (Status s = check_head_view(p, "max_logit", p.max_logit, p.batch, p.batch, "[b, h]", deferred); !s.ok())
      return s;
  return Status::Ok();
}

}  // namespace strideattn::detail
