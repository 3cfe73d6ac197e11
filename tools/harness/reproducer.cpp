// The one-line `strideattn check ...` command that reproduces a case (runner.hpp
// reproducer()); the CLI's parser (tools/strideattn/cli_args.cpp) reads it back. It lives in
// the harness library, not the CLI, because the tests print it for their failures too.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/runner.hpp"
#include "harness/views.hpp"

namespace strideattn::harness {

namespace {

std::string join_backends(const std::vector<Backend>& backends) {
  std::string s;
  for (Backend b : backends) s += (s.empty() ? "" : ",") + std::string(to_string(b));
  return s;
}

bool same_view(const ViewSpec& a, const ViewSpec& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.shape == b.shape && a.stride == b.stride;
}

std::string list(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

std::string reproducer(const CaseSpec& spec, const std::vector<Backend>& backends) {
  std::ostringstream os;
  const ProblemSizes& z = spec.sizes;
  os << "strideattn check --dtype " << to_string(spec.dtype);
  if (z.varlen()) {
    os << " --seqlens-q " << list(z.seqlens_q) << " --seqlens-kv " << list(z.seqlens_kv);
    if (!z.offsets_q.empty()) os << " --offsets-q " << list(z.offsets_q);
    if (!z.offsets_kv.empty()) os << " --offsets-kv " << list(z.offsets_kv);
  } else {
    os << " --batch " << z.batch << " --seqlen-q " << z.s_q << " --seqlen-kv " << z.s_kv;
  }
  os << " --heads " << z.heads << " --kv-heads " << z.kv_heads << " --head-dim " << z.d_qk << " --head-dim-v " << z.d_v;
  LayoutViews made;
  const bool from_layout = !spec.layout_name.empty() && make_layout_views(spec.layout_name, z, &made).ok();
  if (from_layout) os << " --layout '" << spec.layout_name << "'";
  const std::pair<const char*, const ViewSpec*> given[] = {
      {"q", &spec.views.q},    {"k", &spec.views.k},   {"v", &spec.views.v},   {"o", &spec.views.o},
      {"do", &spec.views.d_o}, {"dq", &spec.views.dq}, {"dk", &spec.views.dk}, {"dv", &spec.views.dv}};
  const ViewSpec* layout_view[] = {&made.q, &made.k, &made.v, &made.o, &made.d_o, &made.dq, &made.dk, &made.dv};
  for (int i = 0; i < (spec.grad ? 8 : 4); ++i)
    if (!from_layout || !same_view(*given[i].second, *layout_view[i]))
      os << " --" << given[i].first << " " << format_view(*given[i].second);
  if (spec.options.mask != MaskKind::none) os << " --mask " << to_string(spec.options.mask);
  if (!spec.options.window.unbounded())
    os << " --window " << spec.options.window.left << "," << spec.options.window.right;
  if (spec.options.scale) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", *spec.options.scale);
    os << " --scale " << buf;
  }
  if (spec.options.deterministic) os << " --deterministic";
  const AttentionOptions& o = spec.options;
  const CaseSpec::Features& f = spec.features;
  auto real = [](double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    return std::string(buf);
  };
  if (o.softcap != 0) os << " --softcap " << real(o.softcap);
  if (o.dropout.p != 0)
    os << " --dropout " << real(o.dropout.p) << " --rng-seed " << o.dropout.seed << " --rng-offset "
       << o.dropout.offset;
  if (f.bias) {
    os << " --bias " << format_view(*f.bias) << " --bias-type " << to_string(o.bias_type) << " --bias-dtype "
       << to_string(f.bias_dtype);
    if (f.dbias && spec.grad) os << " --dbias " << format_view(*f.dbias);
  }
  if (f.alibi_rows > 0) os << (f.alibi_rows == 1 ? " --alibi" : " --alibi-per-batch");
  if (f.sinks) os << " --sinks";
  if (f.max_logit) os << " --max-logit";
  if (spec.grad) os << " --grad";
  os << " --seed " << spec.seed;
  if (spec.input_scale != 1.0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", spec.input_scale);
    os << " --input-scale " << buf;
  }
  for (std::size_t i = 0; i < spec.input_plants.size(); ++i) {
    const CaseSpec::InputPlant& pl = spec.input_plants[i];
    os << (i ? "," : " --plant-input ") << pl.tensor << ":" << pl.index << ":"
       << (std::isnan(pl.value) ? "nan"
           : pl.value > 0       ? "inf"
                                : "-inf");
  }
  if (spec.cu_seqlens) os << " --cu-seqlens";
  if (spec.via_plan) os << " --via-plan";
  if (!backends.empty()) os << " --backends " << join_backends(backends);
  return os.str();
}

}  // namespace strideattn::harness
