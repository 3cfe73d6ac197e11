// The training-feature options of PROBLEM (docs/semantics.md "Training features"): --softcap,
// --dropout with --rng-seed / --rng-offset, --bias with --bias-type / --bias-dtype / --dbias,
// --alibi / --alibi-per-batch, --sinks and --max-logit, into a harness::CaseSpec; and their
// one-line description. Values the library defines a range for (softcap >= 0, 0 <= p < 1, the
// bias extents) are passed through: the library's validation refuses them with its message.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cli_args.hpp"

namespace strideattn::cli {

namespace {

Status bad(std::string msg) { return Status(StatusCode::invalid_argument, std::move(msg)); }

Status parse_real(const std::string& opt, const std::string& t, double* out) {
  char* end = nullptr;
  const double x = std::strtod(t.c_str(), &end);
  // strtod also takes hex ("0x10"), leading blanks and "infinity"; only decimal is meant.
  const bool decimal = !t.empty() && t.find_first_not_of("0123456789.eE+-") == std::string::npos;
  if (!decimal || end != t.c_str() + t.size() || !std::isfinite(x))
    return bad("--" + opt + " '" + t + "': expected a finite number");
  *out = x;
  return Status::Ok();
}

Status parse_u64(const std::string& opt, const std::string& t, std::uint64_t* out) {
  const char* end = t.data() + t.size();
  auto [p, ec] = std::from_chars(t.data(), end, *out);
  if (t.empty() || ec != std::errc() || p != end)
    return bad("--" + opt + " '" + t + "': expected an unsigned 64-bit integer (0 .. 18446744073709551615)");
  return Status::Ok();
}

}  // namespace

Status resolve_features(const std::map<std::string, std::string>& values, const std::set<std::string>& flags, bool grad,
                        harness::CaseSpec* spec) {
  auto has = [&](const char* k) { return values.count(k) > 0; };
  AttentionOptions& o = spec->options;
  harness::CaseSpec::Features& f = spec->features;
  f = {};
  if (has("softcap"))
    if (Status s = parse_real("softcap", values.at("softcap"), &o.softcap); !s.ok()) return s;
  if (has("dropout"))
    if (Status s = parse_real("dropout", values.at("dropout"), &o.dropout.p); !s.ok()) return s;
  for (const char* opt : {"rng-seed", "rng-offset"}) {
    if (!has(opt)) continue;
    if (!has("dropout"))
      return bad("--" + std::string(opt) + " " + values.at(opt) + " without --dropout: the seed and offset " +
                 "are dropout's (give --dropout P)");
    std::uint64_t* field = std::string(opt) == "rng-seed" ? &o.dropout.seed : &o.dropout.offset;
    if (Status s = parse_u64(opt, values.at(opt), field); !s.ok()) return s;
  }
  if (has("bias")) {
    harness::ViewSpec v;
    if (Status s = parse_view("bias", values.at("bias"), &v, "b,h,s_q,s_kv"); !s.ok()) return s;
    f.bias = v;
    f.bias_dtype = spec->dtype;
    o.bias_type = BiasType::post_scale;
  }
  if (has("bias-type")) {
    const std::string& t = values.at("bias-type");
    const std::optional<BiasType> type = bias_type_from_string(t);
    if (!type || *type == BiasType::none)
      return bad("unknown --bias-type '" + t + "'; supported: post_scale, pre_scale");
    if (!f.bias)
      return bad("--bias-type " + t + " without --bias: give the bias view (--bias BUF+OFFSET:SHAPE:STRIDES)");
    o.bias_type = *type;
  }
  if (has("bias-dtype")) {
    const std::string& d = values.at("bias-dtype");
    if (!f.bias)
      return bad("--bias-dtype " + d + " without --bias: give the bias view (--bias BUF+OFFSET:SHAPE:STRIDES)");
    if (d == "f16" || d == "fp16")
      f.bias_dtype = DType::f16;
    else if (d == "bf16")
      f.bias_dtype = DType::bf16;
    else if (d == "f32" || d == "fp32")
      f.bias_dtype = DType::f32;
    else
      return bad("unknown --bias-dtype '" + d + "'; supported: f16, bf16, f32");
  }
  if (has("dbias")) {
    if (!f.bias) return bad("--dbias without --bias: dBias is the gradient of a bias");
    if (!grad) return bad("--dbias is an output of the backward: give --grad too");
    harness::ViewSpec v;
    if (Status s = parse_view("dbias", values.at("dbias"), &v, "b,h,s_q,s_kv"); !s.ok()) return s;
    f.dbias = v;
  }
  if (flags.count("alibi") && flags.count("alibi-per-batch"))
    return bad(
        "--alibi and --alibi-per-batch both given: slopes are one row [1, h] (--alibi) or one per batch "
        "[b, h] (--alibi-per-batch); give one");
  if (flags.count("alibi")) f.alibi_rows = 1;
  if (flags.count("alibi-per-batch")) f.alibi_rows = std::max<std::int64_t>(spec->sizes.batch, 1);
  f.sinks = flags.count("sinks") > 0;
  f.max_logit = flags.count("max-logit") > 0;
  return Status::Ok();
}

std::string describe_features(const harness::CaseSpec& spec) {
  const AttentionOptions& o = spec.options;
  const harness::CaseSpec::Features& f = spec.features;
  std::ostringstream os;
  if (o.softcap != 0) os << " softcap=" << o.softcap;
  if (o.dropout.p != 0)
    os << " dropout=" << o.dropout.p << " rng=(" << o.dropout.seed << "," << o.dropout.offset << ")";
  if (f.bias)
    os << " bias=" << to_string(o.bias_type) << "(" << to_string(f.bias_dtype) << " " << format_view(*f.bias) << ")";
  if (f.alibi_rows > 0) os << " alibi=[" << f.alibi_rows << ",h]";
  if (f.sinks) os << " sinks";
  if (f.max_logit) os << " max_logit";
  return os.str();
}

}  // namespace strideattn::cli
