// Random attention problems and random strided views for `strideattn fuzz`: sequence lengths
// off every tile multiple (s = 1, s_q != s_kv both ways), GQA/MQA ratios, head dims 8..256 in
// steps of 8 with d_v != d_qk, every mask and (asymmetric) window, varlen with empty
// sequences and gaps; views from every layout name or random: permuted stride orders, gaps
// between heads and rows, sliced last dims, shared and interleaved buffers, garbage strides
// on size-1 dims, tensors at offsets inside larger buffers; input magnitudes up to the dtype's
// range, extreme scales and planted NaN / Inf; with --features the training features too.
#include "fuzz.hpp"

#include "progress.hpp"

#include "dispatch/select.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

namespace strideattn::cli {

namespace {

using harness::CaseSpec;
using harness::ProblemSizes;
using harness::ViewSpec;

// Work of one case in multiply-adds of the reference (pairs x heads x (d_qk + d_v)); keeps
// 500 cases with --grad within a few minutes on 2 cores.
constexpr double kBudget = 2e7;
// fuzz --features: the largest typical scaled logit of a case with features (cap_logits).
constexpr double kFeatureLogitLimit = 10;

struct Rng {
  std::mt19937_64 g;
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(g);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(g) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[std::size_t(uniform(0, std::int64_t(v.size()) - 1))];
  }
};

std::int64_t seq_len(Rng& r) {
  switch (r.uniform(0, 6)) {
    case 0:
      return 1;
    case 1:
      return r.pick(std::vector<std::int64_t>{63, 65, 64, 127, 129, 96, 17, 191, 257});
    case 2:
      return r.uniform(91, 300);
    default:
      return r.uniform(1, 90);
  }
}

std::int64_t head_dim(Rng& r) {
  const double u = std::uniform_real_distribution<double>(0, 1)(r.g);
  if (u < 0.5) return 8 * r.uniform(1, 8);
  if (u < 0.85) return 8 * r.uniform(9, 16);
  return 8 * r.uniform(17, 32);
}

double cost(const ProblemSizes& z) {
  double pairs = 0;
  if (z.varlen()) {
    for (std::size_t i = 0; i < z.seqlens_q.size(); ++i) pairs += double(z.seqlens_q[i]) * double(z.seqlens_kv[i]);
  } else {
    pairs = double(z.batch) * double(z.s_q) * double(z.s_kv);
  }
  return pairs * double(z.heads) * double(z.d_qk + z.d_v);
}

void draw_sizes(Rng& r, ProblemSizes* z) {
  z->kv_heads = r.uniform(1, 3);
  const std::int64_t ratio = r.pick(std::vector<std::int64_t>{1, 1, 2, 3, 4, 8});
  z->heads = z->kv_heads * ratio;
  if (z->heads > 8) z->kv_heads = 1, z->heads = ratio;  // MQA
  z->d_qk = head_dim(r);
  z->d_v = r.chance(0.65) ? z->d_qk : head_dim(r);
  if (r.chance(0.25)) {  // varlen
    const std::int64_t n = r.uniform(1, 4);
    z->seqlens_q.clear(), z->seqlens_kv.clear(), z->offsets_q.clear(), z->offsets_kv.clear();
    const bool same = r.chance(0.4);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t lq = r.chance(0.2) ? 0 : seq_len(r);
      z->seqlens_q.push_back(lq);
      z->seqlens_kv.push_back(same ? lq : (r.chance(0.2) ? 0 : seq_len(r)));
    }
    for (auto pair : {std::make_pair(&z->seqlens_q, &z->offsets_q), std::make_pair(&z->seqlens_kv, &z->offsets_kv)}) {
      if (r.chance(0.5)) continue;  // packed back to back
      std::int64_t at = r.uniform(0, 5);
      for (std::int64_t len : *pair.first) {
        pair.second->push_back(at);
        at += len + (r.chance(0.6) ? r.uniform(1, 12) : 0);
      }
    }
    z->batch = n;
    z->s_q = *std::max_element(z->seqlens_q.begin(), z->seqlens_q.end());
    z->s_kv = *std::max_element(z->seqlens_kv.begin(), z->seqlens_kv.end());
  } else {
    z->batch = r.uniform(1, 3);
    z->s_q = seq_len(r);
    z->s_kv = r.chance(0.4) ? z->s_q : seq_len(r);
  }
}

// Shrink until the reference work fits the budget.
void fit_budget(ProblemSizes* z) {
  for (int guard = 0; guard < 64 && cost(*z) > kBudget; ++guard) {
    if (z->heads > z->kv_heads) {  // lower the GQA ratio first
      z->heads -= z->kv_heads;
      continue;
    }
    if (z->kv_heads > 1) {
      z->heads = --z->kv_heads;
      continue;
    }
    auto shrink = [](std::int64_t x) { return x > 1 ? (x * 2) / 3 : x; };
    if (z->varlen()) {
      for (auto& l : z->seqlens_q) l = shrink(l);
      for (auto& l : z->seqlens_kv) l = shrink(l);
      if (!z->offsets_q.empty()) {
        std::int64_t at = 0;
        for (std::size_t i = 0; i < z->offsets_q.size(); ++i) z->offsets_q[i] = at, at += z->seqlens_q[i] + 3;
      }
      if (!z->offsets_kv.empty()) {
        std::int64_t at = 0;
        for (std::size_t i = 0; i < z->offsets_kv.size(); ++i) z->offsets_kv[i] = at, at += z->seqlens_kv[i] + 3;
      }
      z->s_q = *std::max_element(z->seqlens_q.begin(), z->seqlens_q.end());
      z->s_kv = *std::max_element(z->seqlens_kv.begin(), z->seqlens_kv.end());
    } else if (z->batch > 1) {
      --z->batch;
    } else {
      z->s_q = shrink(z->s_q), z->s_kv = shrink(z->s_kv);
      if (z->s_q == 1 && z->s_kv == 1) z->d_qk = z->d_v = 8;
    }
  }
}

// One random view of `shape` in `buffer`, starting at or after element `base`; returns the
// view and advances `base` past it.
ViewSpec random_view(Rng& r, const std::string& buffer, const Dims4& shape, std::int64_t* base) {
  ViewSpec v;
  v.buffer = buffer;
  v.shape = shape;
  std::vector<int> order = {kBatch, kSeq, kHead};  // outer -> inner
  std::shuffle(order.begin(), order.end(), r.g);
  const std::int64_t row = shape[kHeadDim] + (r.chance(0.4) ? r.uniform(1, 12) : 0);
  v.stride[kHeadDim] = 1;
  std::int64_t inner = row;
  for (int i = 2; i >= 0; --i) {
    const int d = order[std::size_t(i)];
    v.stride[d] = inner;
    inner = inner * std::max<std::int64_t>(shape[d], 1) + (r.chance(0.35) ? r.uniform(1, 40) : 0);
  }
  for (int d = 0; d < 4; ++d)  // size-1 dims may carry any stride
    if (shape[d] == 1 && r.chance(0.5)) v.stride[d] = r.pick(std::vector<std::int64_t>{0, 1, 7, 999983, -5, 123456789});
  v.offset = *base + (r.chance(0.5) ? r.uniform(1, 30) : 0);
  *base = harness::required_extent(v) + r.uniform(0, 16);
  return v;
}

// Q, K, V interleaved in the rows of one buffer (a split of a fused projection), with a
// head stride of at least max(d_qk, d_v) and gaps; needs equal q and kv token counts.
void fused_qkv(Rng& r, const std::string& buffer, std::int64_t b, std::int64_t s, const ProblemSizes& z, ViewSpec* q,
               ViewSpec* k, ViewSpec* v) {
  const std::int64_t hs = std::max(z.d_qk, z.d_v) + (r.chance(0.4) ? r.uniform(1, 8) : 0);
  const std::int64_t row = (z.heads + 2 * z.kv_heads) * hs + (r.chance(0.3) ? r.uniform(1, 20) : 0);
  const bool seq_outer = r.chance(0.5);
  const Dims4 stride = seq_outer ? Dims4{row, b * row, hs, 1} : Dims4{s * row, row, hs, 1};
  const std::int64_t base = r.chance(0.5) ? r.uniform(1, 20) : 0;
  *q = ViewSpec{buffer, base, {b, s, z.heads, z.d_qk}, stride};
  *k = ViewSpec{buffer, base + z.heads * hs, {b, s, z.kv_heads, z.d_qk}, stride};
  *v = ViewSpec{buffer, base + (z.heads + z.kv_heads) * hs, {b, s, z.kv_heads, z.d_v}, stride};
  for (ViewSpec* x : {q, k, v})
    if (b == 1 && r.chance(0.5)) x->stride[kBatch] = 31337;  // garbage stride on a size-1 dim
}

void random_views(Rng& r, const ProblemSizes& z, bool grad, harness::LayoutViews* lv) {
  const std::int64_t b = z.varlen() ? 1 : z.batch;
  const std::int64_t sq = z.q_tokens(), skv = z.kv_tokens();
  const Dims4 qs{b, sq, z.heads, z.d_qk}, ks{b, skv, z.kv_heads, z.d_qk};
  const Dims4 vs{b, skv, z.kv_heads, z.d_v}, os{b, sq, z.heads, z.d_v};
  const int mode = int(r.uniform(0, 2));  // 0 separate buffers, 1 one shared buffer, 2 fused
  std::int64_t cursor = 0;
  auto place = [&](const char* name, const Dims4& shape) {
    if (mode == 1) return random_view(r, "mem", shape, &cursor);
    std::int64_t base = 0;
    return random_view(r, name, shape, &base);
  };
  if (mode == 2 && sq == skv) {
    fused_qkv(r, "qkv", b, sq, z, &lv->q, &lv->k, &lv->v);
    if (grad) fused_qkv(r, "dqkv", b, sq, z, &lv->dq, &lv->dk, &lv->dv);
  } else {
    lv->q = place("q", qs);
    lv->k = place("k", ks);
    lv->v = place("v", vs);
    if (grad) {
      lv->dq = place("dq", qs);
      lv->dk = place("dk", ks);
      lv->dv = place("dv", vs);
    }
  }
  lv->o = place("o", os);
  if (grad) lv->d_o = place("do", os);
}

// The numerical edges (docs/semantics.md, "Non-finite values, overflow and the scale"), with
// and without the backward: inputs scaled up to the dtype's range (logits up to fp32
// overflow; the rule's conditioning allowances and overflow flags make every magnitude
// checkable), extreme scales, and NaN or Inf planted in Q, K, V or dO.
void draw_numerical_edges(Rng& r, bool plant_non_finite, CaseSpec* spec) {
  const double range = spec->dtype == DType::f16 ? 8e3 : 4e37;  // the dtype's largest / 8
  auto log_uniform = [&](double lo, double hi) {
    return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(r.g));
  };
  // Half of the scaled cases stay below 1e4 (logits up to about 1e8, where an fp32 LSE still
  // determines the backward's P on rows that are not one-hot), half reach the dtype's range.
  if (r.chance(0.25)) spec->input_scale = log_uniform(1.0, r.chance(0.5) ? std::min(range, 1e4) : range);
  if (r.chance(0.08)) spec->options.scale = r.pick(std::vector<double>{1e-30, 1e-8, 1e4, 1e10, 1e30});
  if (r.chance(0.1) && plant_non_finite) {
    std::vector<std::string> tensors = {"q", "k", "v"};
    if (spec->grad) tensors.push_back("do");
    const double values[] = {std::nan(""), HUGE_VAL, -HUGE_VAL};
    for (std::int64_t n = r.uniform(1, 3); n > 0; --n)
      spec->input_plants.push_back({r.pick(tensors), r.uniform(0, 1 << 20), values[r.uniform(0, 2)]});
  }
}

// A bias-shaped view [B, H, SQ, SKV] in `buffer`: a random dimension order, gaps, some
// negative strides (the offset then puts the lowest element at or after 0) and, where
// `broadcast_strides`, stride 0 on extent-1 dimensions and sometimes on full ones (an input
// read the same along them).
ViewSpec random_bias_view(Rng& r, const std::string& buffer, const Dims4& shape, bool broadcast_strides) {
  ViewSpec v;
  v.buffer = buffer;
  v.shape = shape;
  std::vector<int> order = {0, 1, 2, 3};  // outer -> inner
  if (r.chance(0.5)) std::shuffle(order.begin(), order.end(), r.g);
  std::int64_t inner = r.chance(0.2) ? r.uniform(2, 3) : 1;
  for (int i = 3; i >= 0; --i) {
    const int d = order[std::size_t(i)];
    v.stride[d] = inner;
    inner = inner * std::max<std::int64_t>(shape[d], 1) + (r.chance(0.3) ? r.uniform(1, 9) : 0);
  }
  std::int64_t low = 0;
  for (int d = 0; d < 4; ++d) {
    if (broadcast_strides && (shape[d] == 1 ? r.chance(0.5) : r.chance(0.1))) v.stride[d] = 0;
    if (shape[d] > 1 && r.chance(0.15)) v.stride[d] = -v.stride[d];
    if (v.stride[d] < 0) low += (shape[d] - 1) * v.stride[d];
  }
  v.offset = -low + (r.chance(0.5) ? r.uniform(1, 20) : 0);
  return v;
}

// The training features (docs/semantics.md "Training features"), each drawn on its own:
// softcap, dropout (p up to 0.9, any seed and offset), a post- or pre-scale bias of any
// broadcast shape, strides and dtype (and a strided dBias), ALiBi slopes of one row or one per
// batch, sinks, the max logit; at least one of them. From a stream of their own: the rest of
// the case is the one drawn without --features. Then the features some backend of
// `backends` does not run are dropped (their draws still made: the others stay the same),
// and a case left with none asks for the max logit where every backend runs it.
void draw_features(std::uint64_t seed, std::int64_t index, const std::vector<Backend>& backends, CaseSpec* spec) {
  Rng r{std::mt19937_64(seed * 0xd1b54a32d192ed03ull + std::uint64_t(index) * 0x94d049bb133111ebull + 7)};
  AttentionOptions& o = spec->options;
  CaseSpec::Features& f = spec->features;
  const ProblemSizes& z = spec->sizes;
  auto u01 = [&] { return std::uniform_real_distribution<double>(0, 1)(r.g); };
  bool any = false;
  if (r.chance(0.35)) {
    o.softcap = std::exp(std::log(0.5) + u01() * (std::log(50.0) - std::log(0.5)));
    any = true;
  }
  if (r.chance(0.35)) {
    o.dropout.p = r.chance(0.3) ? r.pick(std::vector<double>{0.1, 0.5, 0.9}) : 0.9 * u01();
    if (o.dropout.p == 0) o.dropout.p = 0.25;
    o.dropout.seed = r.g();
    o.dropout.offset = r.chance(0.2) ? ~std::uint64_t(0) - std::uint64_t(r.uniform(0, 8)) : r.g() >> r.uniform(0, 63);
    any = true;
  }
  if (r.chance(0.4)) {
    o.bias_type = r.chance(0.5) ? BiasType::post_scale : BiasType::pre_scale;
    const std::int64_t full[4] = {z.batch, z.heads, z.s_q, z.s_kv};
    Dims4 shape{};
    for (int d = 0; d < 4; ++d) {
      shape[d] = r.chance(0.35) ? 1 : full[d];
      if (z.varlen() && d >= 2 && shape[d] == full[d] && r.chance(0.3)) shape[d] += r.uniform(1, 5);
    }
    f.bias_dtype = r.pick(std::vector<DType>{DType::f32, DType::f16, DType::bf16});
    f.bias = random_bias_view(r, "bias", shape, true);
    if (spec->grad && r.chance(0.5)) f.dbias = random_bias_view(r, "dbias", shape, false);
    any = true;
  }
  if (r.chance(0.3)) {
    f.alibi_rows = r.chance(0.5) ? 1 : std::max<std::int64_t>(z.batch, 1);
    any = true;
  }
  if (r.chance(0.3)) f.sinks = any = true;
  if (r.chance(0.35) || !any) f.max_logit = true;

  auto runs = [&](std::string_view feature) {
    for (Backend b : backends)
      if (!detail::runs_feature(b, feature)) return false;
    return true;
  };
  if (!runs("softcap")) o.softcap = 0;
  if (!runs("dropout")) o.dropout = {};
  if (!runs("bias")) o.bias_type = BiasType::none, f.bias.reset(), f.dbias.reset();
  if (!runs("alibi")) f.alibi_rows = 0;
  if (!runs("sinks")) f.sinks = false;
  if (!runs("max_logit")) f.max_logit = false;
  if (!spec->any_feature() && runs("max_logit")) f.max_logit = true;
}

}  // namespace

CaseSpec random_case(std::uint64_t seed, std::int64_t index, bool grad, bool plant_non_finite, bool features,
                     const std::vector<Backend>& backends) {
  Rng r{std::mt19937_64(seed * 0x9e3779b97f4a7c15ull + std::uint64_t(index) * 0xbf58476d1ce4e5b9ull + 1)};
  CaseSpec spec;
  spec.grad = grad;
  spec.seed = seed * 1000003ull + std::uint64_t(index);
  spec.dtype = r.pick(std::vector<DType>{DType::f16, DType::f16, DType::bf16, DType::bf16, DType::f32});
  draw_sizes(r, &spec.sizes);
  const bool use_layout = r.chance(0.45);
  if (use_layout && r.chance(0.4)) {
    // Make the packed layouts (one head count, one head dim, equal token counts) possible.
    ProblemSizes& z = spec.sizes;
    z.kv_heads = z.heads;
    z.d_v = z.d_qk;
    z.s_kv = z.s_q;
    z.seqlens_kv = z.seqlens_q;
    z.offsets_kv = z.offsets_q;
  }
  fit_budget(&spec.sizes);
  const ProblemSizes& z = spec.sizes;

  AttentionOptions& o = spec.options;
  o.mask = r.pick(std::vector<MaskKind>{MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right});
  if (r.chance(0.35)) {
    const std::int64_t span = std::max(z.s_q, z.s_kv);
    o.window.left = r.chance(0.3) ? -1 : r.uniform(0, span);
    o.window.right = r.chance(0.3) ? -1 : r.uniform(0, span);
  }
  if (r.chance(0.15)) o.scale = std::uniform_real_distribution<double>(0.02, 0.6)(r.g);
  o.deterministic = r.chance(0.1);

  // Views: a layout name (maybe with an output moved into a larger buffer), or random views.
  bool done = false;
  if (use_layout) {
    std::vector<std::string> names = harness::layout_names();
    std::shuffle(names.begin(), names.end(), r.g);
    for (const std::string& n : names)
      if (harness::make_layout_views(n, z, &spec.views).ok()) {
        spec.layout_name = n;
        done = true;
        break;
      }
    if (done && r.chance(0.3)) {
      std::int64_t base = 0;
      spec.views.o = random_view(r, "obig", spec.views.o.shape, &base);
    }
  }
  if (!done) {
    spec.layout_name.clear();
    random_views(r, z, grad, &spec.views);
  }
  draw_numerical_edges(r, plant_non_finite, &spec);
  if (features) {
    draw_features(seed, index, backends, &spec);
    // Scores that overflow fp32 have no defined finite answer once a softcap or a sink bounds
    // the result (a backend's fp32 sum may reach either infinity), and the conditioning
    // allowances model the plain scores only, so the tolerance alone must hold: cases with a
    // feature that changes the logits or P keep typical logits at most kFeatureLogitLimit.
    if (harness::features_change_scores(spec)) cap_logits(kFeatureLogitLimit, &spec);
  }
  return spec;
}

void cap_logits(double logit_limit, CaseSpec* spec) {
  if (!(logit_limit > 0)) return;
  const double root_d = std::sqrt(double(std::max<std::int64_t>(spec->sizes.d_qk, 1)));
  std::optional<double>& scale = spec->options.scale;
  if (scale && *scale * root_d > logit_limit) scale.reset();  // the default 1 / sqrt(d_qk)
  const double eff = scale.value_or(1 / root_d) * root_d;
  const double limit = std::sqrt(logit_limit / std::max(eff, 1.0));  // a tiny scale buys no input range
  if (spec->input_scale > limit) spec->input_scale = std::max(1.0, limit);
}

int run_fuzz(const Invocation& inv, const std::vector<Backend>& backends) {
  using json = nlohmann::ordered_json;
  if (inv.require_gpu && !harness::gpu_available()) {
    if (inv.json)
      std::printf("%s\n",
                  json({{"skipped", "no GPU present (this test needs one)"}, {"exit_code", 77}}).dump(2).c_str());
    else
      std::printf("fuzz: skipped: no GPU present (this test needs one)\n");
    return 77;
  }
  std::int64_t passed = 0, failed = 0, unsupported = 0;
  std::map<Backend, std::map<std::string, std::int64_t>> tally;
  json failures = json::array();
  auto ran = [&](Backend b) { return tally[b]["ok"] + tally[b]["mismatch"]; };
  auto short_of_min_ran = [&] {
    for (Backend b : backends)
      if (ran(b) < inv.min_ran) return true;
    return false;
  };
  const std::int64_t max_draws = inv.cases + 50 * inv.min_ran;
  std::int64_t drawn = 0;
  ProgressLine line(inv.json, 0.0);
  for (std::int64_t i = 0; i < max_draws && (i < inv.cases || short_of_min_ran()); ++i) {
    drawn = i + 1;
    line.show("fuzz: case " + std::to_string(i + 1) +
              (i < inv.cases ? "/" + std::to_string(inv.cases) : " (for --min-ran)") + ", " + std::to_string(failed) +
              " failed");
    CaseSpec spec = random_case(inv.seed, i, inv.grad, !inv.finite_inputs, inv.features, backends);
    cap_logits(inv.logit_limit, &spec);
    spec.cu_seqlens = inv.cu_seqlens && spec.sizes.varlen();
    spec.via_plan = inv.via_plan;
    harness::CaseReport rep;
    const Status s = harness::run_case(spec, backends, &rep);
    const std::string repro = harness::reproducer(spec, backends);
    bool case_failed = false, case_unsupported = false;
    auto report = [&](const std::string& backend, const std::string& status, const std::string& why) {
      case_failed = true;
      failures.push_back(
          {{"case", i}, {"backend", backend}, {"status", status}, {"reason", why}, {"reproducer", repro}});
      if (!inv.json) {
        line.clear();
        std::printf("FAIL case %lld: %s %s: %s\n  %s\n", static_cast<long long>(i), backend.c_str(), status.c_str(),
                    why.c_str(), repro.c_str());
        std::fflush(stdout);
      }
    };
    if (!s.ok()) {
      report("(case)", std::string(to_string(s.code())), s.message());
    } else {
      for (const harness::BackendResult& r : rep.backends) {
        ++tally[r.backend][r.status];
        if (r.status == "mismatch" || r.status == "error")
          report(std::string(to_string(r.backend)), r.status, r.reason);
        else if (r.status == "unsupported")
          case_unsupported = true;
      }
    }
    if (case_failed)
      ++failed;
    else if (case_unsupported)
      ++unsupported;
    else
      ++passed;
  }
  line.clear();
  std::vector<std::string> never_ran;
  for (Backend b : backends)
    if (drawn > 0 && ran(b) == 0) never_ran.push_back(std::string(to_string(b)));
  const bool vacuous = inv.require_ran && !never_ran.empty();
  const bool short_ran = short_of_min_ran();
  const int code = (failed > 0 || vacuous || short_ran) ? 1 : 0;
  if (inv.json) {
    json per = json::object();
    for (auto& [b, m] : tally) per[std::string(to_string(b))] = m;
    json j = {{"cases", drawn},       {"seed", inv.seed}, {"grad", inv.grad},
              {"passed", passed},     {"failed", failed}, {"unsupported", unsupported},
              {"failures", failures}, {"backends", per},  {"exit_code", code}};
    std::printf("%s\n", j.dump(2).c_str());
    return code;
  }
  for (auto& [b, m] : tally) {
    std::printf("fuzz: %-9s", std::string(to_string(b)).c_str());
    for (auto& [status, n] : m) std::printf(" %s=%lld", status.c_str(), static_cast<long long>(n));
    std::printf("\n");
  }
  if (vacuous)
    for (const std::string& b : never_ran)
      std::printf("fuzz: FAIL: backend %s ran no case (every case unsupported): nothing was tested\n", b.c_str());
  if (short_ran)
    for (Backend b : backends)
      if (ran(b) < inv.min_ran)
        std::printf("fuzz: FAIL: backend %s ran %lld cases in %lld draws; --min-ran asks %lld\n",
                    std::string(to_string(b)).c_str(), static_cast<long long>(ran(b)), static_cast<long long>(drawn),
                    static_cast<long long>(inv.min_ran));
  std::printf("fuzz: %lld cases: %lld passed, %lld failed, %lld unsupported\n", static_cast<long long>(drawn),
              static_cast<long long>(passed), static_cast<long long>(failed), static_cast<long long>(unsupported));
  return code;
}

}  // namespace strideattn::cli
