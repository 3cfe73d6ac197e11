// The buffers and arguments of one case (case_setup.hpp): the case's views and the LSE
// pseudo-view, element pointers, forward/backward arguments, the checks a case passes before
// anything is allocated (view bounds, host memory, the fp64 reference's work), and
// prepare(), which allocates and fills the buffers. Also estimate_host_memory (runner.hpp).
#include "harness/case_setup.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <type_traits>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "common/dtype.hpp"
#include "harness/checked.hpp"
#include "harness/verify.hpp"

namespace strideattn::harness::internal {

std::string fmt(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

namespace {

CaseViews case_views(const CaseSpec& spec) {
  CaseViews cv{&spec.views.q,  &spec.views.k,   &spec.views.v,
               &spec.views.o,  &spec.views.d_o, &spec.views.dq,
               &spec.views.dk, &spec.views.dv,  {},
               spec.grad};
  const std::int64_t b = spec.views.q.shape[kBatch], s = spec.views.q.shape[kSeq];
  const std::int64_t h = spec.views.q.shape[kHead];
  cv.lse.buffer = kLseBuffer;
  cv.lse.shape = {b, h, s, 1};
  cv.lse.stride = {checked_mul(h, s).value_or(kInt64Max), s, 1, 1};  // prepare() bounds it
  // Training features.
  const CaseSpec::Features& f = spec.features;
  const auto head_table = [&](const char* buffer, std::int64_t rows) {
    return ViewSpec{buffer, 0, {rows, h, 1, 1}, {h, 1, 1, 1}};
  };
  if (f.bias) {
    cv.bias = *f.bias;
    cv.bias_dtype = f.bias_dtype;
    if (spec.grad) {
      if (f.dbias) {
        cv.dbias = *f.dbias;
      } else {
        const Dims4& n = f.bias->shape;
        const auto pos = [](std::int64_t x) { return std::max<std::int64_t>(x, 1); };
        cv.dbias =
            ViewSpec{kDBiasBuffer, 0, n, {pos(n[1]) * pos(n[2]) * pos(n[3]), pos(n[2]) * pos(n[3]), pos(n[3]), 1}};
      }
    }
  }
  if (f.alibi_rows > 0) cv.alibi = head_table(kAlibiBuffer, f.alibi_rows);
  if (f.sinks) cv.sinks = head_table(kSinksBuffer, 1);
  if (f.max_logit) cv.max_logit = head_table(kMaxLogitBuffer, spec.sizes.batch);
  if (f.sinks && spec.grad) cv.d_sinks = head_table(kDSinksBuffer, 1);
  return cv;
}

}  // namespace

std::vector<const ViewSpec*> CaseViews::feature_inputs() const {
  std::vector<const ViewSpec*> out;
  for (const ViewSpec* v : {&bias, &alibi, &sinks})
    if (!v->buffer.empty()) out.push_back(v);
  return out;
}

std::vector<const ViewSpec*> CaseViews::forward_feature_outputs() const {
  if (max_logit.buffer.empty()) return {};
  return {&max_logit};
}

std::vector<const ViewSpec*> CaseViews::backward_feature_outputs() const {
  std::vector<const ViewSpec*> out;
  for (const ViewSpec* v : {&dbias, &d_sinks})
    if (!v->buffer.empty()) out.push_back(v);
  return out;
}

std::int64_t numel(const ViewSpec& v) {
  const auto pos = [](std::int64_t x) { return std::max<std::int64_t>(x, 0); };
  return checked_product({pos(v.shape[0]), pos(v.shape[1]), pos(v.shape[2]), pos(v.shape[3])}).value_or(kInt64Max);
}

namespace {

TensorView tensor(const Bases& bases, const ViewSpec& v, DType dtype) {
  TensorView t;
  t.data = bases.at(v.buffer) + v.offset * std::int64_t(size_of(dtype));
  t.dtype = dtype;
  t.shape = v.shape;
  t.stride = v.stride;
  return t;
}

LseView lse_view(const Bases& bases, const CaseViews& cv) {
  LseView l;
  l.data = reinterpret_cast<float*>(bases.at(kLseBuffer));
  l.shape = {cv.lse.shape[0], cv.lse.shape[1], cv.lse.shape[2]};
  l.stride = {cv.lse.stride[0], cv.lse.stride[1], cv.lse.stride[2]};
  return l;
}

BiasView bias_view(const Bases& bases, const ViewSpec& v, DType dtype) {
  BiasView b;
  if (v.buffer.empty()) return b;
  b.data = bases.at(v.buffer) + v.offset * std::int64_t(size_of(dtype));
  b.dtype = dtype;
  b.shape = v.shape;
  b.stride = v.stride;
  return b;
}

HeadView head_view(const Bases& bases, const ViewSpec& v) {
  HeadView t;
  if (v.buffer.empty()) return t;
  t.data = reinterpret_cast<float*>(bases.at(v.buffer)) + v.offset;
  t.shape = {v.shape[0], v.shape[1]};
  t.stride = {v.stride[0], v.stride[1]};
  return t;
}

Varlen varlen_of(const ProblemSizes& sizes) {
  Varlen vl;
  if (!sizes.varlen()) return vl;
  vl.seqlens_q = sizes.seqlens_q;
  vl.seqlens_kv = sizes.seqlens_kv;
  vl.offsets_q = sizes.offsets_q;
  vl.offsets_kv = sizes.offsets_kv;
  return vl;
}

// What forward and backward share: q, k, v, the forward's o and lse, options, varlen, and
// where to run.
template <class Args>
Args shared_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases, Backend backend, Memory memory) {
  Args a;
  a.q = tensor(bases, *cv.q, spec.dtype);
  a.k = tensor(bases, *cv.k, spec.dtype);
  a.v = tensor(bases, *cv.v, spec.dtype);
  a.o = tensor(bases, *cv.o, spec.dtype);
  a.lse = lse_view(bases, cv);
  a.options = spec.options;
  a.varlen = varlen_of(spec.sizes);
  a.backend = backend;
  a.memory = memory;
  a.bias = bias_view(bases, cv.bias, cv.bias_dtype);
  a.alibi_slopes = head_view(bases, cv.alibi);
  a.sinks = head_view(bases, cv.sinks);
  return a;
}

}  // namespace

ForwardArgs forward_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases, Backend backend,
                         Memory memory) {
  ForwardArgs a = shared_args<ForwardArgs>(spec, cv, bases, backend, memory);
  a.max_logit = head_view(bases, cv.max_logit);
  return a;
}

BackwardArgs backward_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases, Backend backend,
                           Memory memory) {
  BackwardArgs a = shared_args<BackwardArgs>(spec, cv, bases, backend, memory);
  a.d_o = tensor(bases, *cv.d_o, spec.dtype);
  a.dq = tensor(bases, *cv.dq, spec.dtype);
  a.dk = tensor(bases, *cv.dk, spec.dtype);
  a.dv = tensor(bases, *cv.dv, spec.dtype);
  a.dbias = bias_view(bases, cv.dbias, cv.bias_dtype);
  a.d_sinks = head_view(bases, cv.d_sinks);
  return a;
}

void use_cu_seqlens(const CaseSpec& spec, const Bases& bases, Varlen* vl) {
  const ProblemSizes& z = spec.sizes;
  const std::int64_t n = std::int64_t(z.seqlens_q.size());
  auto* tables = reinterpret_cast<const std::int32_t*>(bases.at(kCuSeqlensBuffer));
  *vl = Varlen{};
  vl->count = n;
  vl->cu_seqlens_q = tables;
  vl->cu_seqlens_kv = tables + n + 1;
  if (!z.offsets_q.empty()) vl->seq_offsets_q = tables + 2 * n + 2;
  if (!z.offsets_kv.empty()) vl->seq_offsets_kv = tables + 3 * n + 2;
  for (auto x : z.seqlens_q) vl->max_seqlen_q = std::max(vl->max_seqlen_q, x);
  for (auto x : z.seqlens_kv) vl->max_seqlen_kv = std::max(vl->max_seqlen_kv, x);
}

namespace {

// The plan's arguments: a 16-byte aligned pointer is left to the run (null: the plan assumes
// 16 bytes), a less aligned one is replaced by one 16 bytes further on, which has the same
// alignment but is not the run's (a plan that kept a make-time pointer would read and write
// the wrong elements; the shifted view stays inside its buffer's guard band, in the same
// allocation, so its memory kind is the run's). The LSE stays requested by its shape.
template <class Args>
Args without_pointers(Args a) {
  auto strip = [](auto*& p) {
    using T = std::remove_reference_t<decltype(p)>;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    p = addr % 16 == 0 ? nullptr : reinterpret_cast<T>(addr + 16);
  };
  strip(a.q.data), strip(a.k.data), strip(a.v.data), strip(a.o.data), strip(a.lse.data);
  strip(a.bias.data), strip(a.alibi_slopes.data), strip(a.sinks.data);
  if constexpr (std::is_same_v<Args, BackwardArgs>)
    strip(a.d_o.data), strip(a.dq.data), strip(a.dk.data), strip(a.dv.data), strip(a.dbias.data), strip(a.d_sinks.data);
  else
    strip(a.max_logit.data);
  a.varlen.cu_seqlens_q = a.varlen.cu_seqlens_kv = a.varlen.seq_offsets_q = a.varlen.seq_offsets_kv = nullptr;
  return a;
}

template <class Run, class Args>
void common_run(const Args& a, Run* r) {
  r->stream = a.stream, r->workspace = a.workspace, r->workspace_bytes = a.workspace_bytes;
  r->cu_seqlens_q = a.varlen.cu_seqlens_q, r->cu_seqlens_kv = a.varlen.cu_seqlens_kv;
  r->seq_offsets_q = a.varlen.seq_offsets_q, r->seq_offsets_kv = a.varlen.seq_offsets_kv;
  r->cancel = a.options.cancel;
  r->bias = a.bias.data, r->alibi_slopes = a.alibi_slopes.data, r->sinks = a.sinks.data;
  r->dropout_seed = a.options.dropout.seed, r->dropout_offset = a.options.dropout.offset;
  r->dropout_seed_ptr = a.options.dropout.seed_ptr, r->dropout_offset_ptr = a.options.dropout.offset_ptr;
}

}  // namespace

Status run_forward(const CaseSpec& spec, const ForwardArgs& a) {
  if (!spec.via_plan) return forward(a);
  ForwardPlan plan;
  if (Status s = make_plan(without_pointers(a), &plan); !s.ok()) return s;
  ForwardRun r;
  r.q = a.q.data, r.k = a.k.data, r.v = a.v.data, r.o = a.o.data, r.lse = a.lse.data;
  r.max_logit = a.max_logit.data;
  common_run(a, &r);
  return plan.run(r);
}

Status run_backward(const CaseSpec& spec, const BackwardArgs& a) {
  if (!spec.via_plan) return backward(a);
  BackwardPlan plan;
  if (Status s = make_plan(without_pointers(a), &plan); !s.ok()) return s;
  BackwardRun r;
  r.q = a.q.data, r.k = a.k.data, r.v = a.v.data, r.o = a.o.data, r.d_o = a.d_o.data, r.lse = a.lse.data;
  r.dq = a.dq.data, r.dk = a.dk.data, r.dv = a.dv.data;
  r.dbias = a.dbias.data, r.d_sinks = a.d_sinks.data;
  common_run(a, &r);
  return plan.run(r);
}

Bases host_bases(BufferSet& bufs) {
  Bases b;
  for (auto& [name, buf] : bufs.all()) b[name] = static_cast<std::byte*>(buf.data());
  return b;
}

namespace {

// The most elements the harness allocates for one buffer.
constexpr std::int64_t kMaxBufferElems = std::int64_t(1) << 33;

// A view must lie inside a buffer the harness can allocate: no element before element 0
// (negative offsets or strides), none at or past kMaxBufferElems (an empty view: its offset).
Status check_view_bounds(const char* tensor_name, const ViewSpec& v) {
  const std::string what = std::string("--") + tensor_name + " " + format_view(v);
  if (v.buffer.empty()) return Status(StatusCode::invalid_argument, what + ": no buffer name");
  if (v.offset < 0)
    return Status(StatusCode::invalid_argument, what + ": offset " + std::to_string(v.offset) + " is negative");
  const bool empty = std::any_of(v.shape.begin(), v.shape.end(), [](std::int64_t n) { return n <= 0; });
  const std::int64_t extent = required_extent(v);  // saturates at kInt64Max
  if (extent > kMaxBufferElems)
    return Status(StatusCode::invalid_argument,
                  what +
                      (empty ? ": starts at element " + std::to_string(v.offset)
                             : ": reaches element " + (extent == kInt64Max ? std::string("2^63 - 1 or beyond")
                                                                           : std::to_string(extent - 1))) +
                      " of buffer '" + v.buffer +
                      "'; the harness allocates at most 2^33 "
                      "elements per buffer");
  if (empty) return Status::Ok();
  // 128-bit arithmetic, each term clamped to +-2^100: huge strides give a message, not UB.
  constexpr __int128 kClamp = __int128(1) << 100;
  __int128 lowest = v.offset;
  for (int i = 0; i < 4; ++i)
    if (v.stride[i] < 0) lowest += std::max(__int128(v.shape[i] - 1) * v.stride[i], -kClamp);
  if (lowest < 0)
    return Status(StatusCode::invalid_argument,
                  what + ": reaches element " +
                      (lowest < INT64_MIN ? std::string("below -2^63") : std::to_string(std::int64_t(lowest))) +
                      " before the start of buffer '" + v.buffer +
                      "'; offsets and strides must keep every element at index >= 0");
  return Status::Ok();
}

// Refuses a case whose host memory (estimate_host_memory) exceeds 75% of the machine's: a
// case larger than the machine must be a clear refusal, not the out-of-memory killer.
Status check_host_memory(const HostMemoryEstimate& e, std::int64_t keys) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return Status::Ok();  // unknown: let the allocation decide
  const double have = double(pages) * double(page);
  if (e.total() <= 0.75 * have) return Status::Ok();
  auto gib = [](double b) {
    std::ostringstream os;
    os.precision(3);
    os << b / double(1ull << 30) << " GiB";
    return os.str();
  };
  std::string parts = gib(e.buffers) + " for its buffers (their real extents) and their copies";
  if (e.reference > 0) parts += ", " + gib(e.reference) + " for the fp64 reference's results";
  if (e.scratch > 0)
    parts += ", " + gib(e.scratch) + " for the reference's copies of K and V (" + std::to_string(keys) +
             " keys) on each thread";
  return Status(StatusCode::invalid_argument, "the case needs about " + gib(e.total()) + " of host memory: " + parts +
                                                  "; this machine has " + gib(have) + " (at most 75% is used)");
}

// CaseSpec::input_scale and input_plants on the freshly drawn buffers. Scaling is per
// buffer (views of one fused buffer scale together); outputs are poisoned later anyway.
Status apply_input_draws(const CaseSpec& spec, Prepared* p) {
  if (!(spec.input_scale > 0) || !std::isfinite(spec.input_scale))
    return Status(StatusCode::invalid_argument,
                  "input scale " + fmt(spec.input_scale) + ": expected a finite value > 0");
  if (spec.input_scale != 1.0)
    for (auto& [name, buf] : p->bufs.all()) {
      if (name[0] == '#') continue;  // the harness's own buffers (LSE, cu_seqlens, features)
      for (std::int64_t i = 0; i < buf.extent(); ++i) {
        const float x = detail::load_as_float(buf.data(), buf.dtype(), i);
        detail::store_from_float(buf.data(), buf.dtype(), i, float(double(x) * spec.input_scale));
      }
    }
  for (const CaseSpec::InputPlant& pl : spec.input_plants) {
    const ViewSpec* v = pl.tensor == "q"                 ? p->cv.q
                        : pl.tensor == "k"               ? p->cv.k
                        : pl.tensor == "v"               ? p->cv.v
                        : pl.tensor == "do" && spec.grad ? p->cv.d_o
                                                         : nullptr;
    if (v == nullptr)
      return Status(StatusCode::invalid_argument,
                    "input plant '" + pl.tensor + "': expected q, k, v, or do (with --grad)");
    const std::vector<std::int64_t> offs = view_offsets(*v);
    if (offs.empty()) continue;
    const std::int64_t at = offs[std::size_t(std::clamp<std::int64_t>(pl.index, 0, std::int64_t(offs.size()) - 1))];
    detail::store_from_float(p->bufs.at(v->buffer).data(), p->bufs.at(v->buffer).dtype(), at, float(pl.value));
  }
  return Status::Ok();
}

// The fp64 reference's work, refused past the reference backend's own limit (its work rule:
// 1e14 FLOP): a valid but absurd case, e.g. K and V of stride 0 over 2^50 keys, must be a
// refusal, not a hang.
Status check_reference_work(const detail::Problem& problem) {
  constexpr double kMaxFlop = 1e14;
  const double flop = problem.flops();
  if (flop <= kMaxFlop) return Status::Ok();
  std::ostringstream os;
  os.precision(3);
  os << "the fp64 reference would need about " << flop << " FLOP for this case's " << to_string(problem.direction)
     << " (every query against every visible key, " << problem.visible_pairs()
     << " pairs); the harness checks cases of at most " << kMaxFlop << " FLOP (the reference backend's limit)";
  return Status(StatusCode::invalid_argument, os.str());
}

// The case's buffers: one per distinct name of the data views (the case's dtype), the LSE,
// and the feature buffers. A bias or dBias view in a buffer of the data views must have the
// case's dtype; in a buffer of its own it has the bias dtype.
Status allocate_buffers(const CaseSpec& spec, Prepared* p) {
  const CaseViews& cv = p->cv;
  std::vector<const ViewSpec*> data = cv.data_views();
  std::map<std::string, std::int64_t> own;  // bias / dBias buffers of their own: extent
  for (auto [name, v] : {std::pair{"bias", &cv.bias}, std::pair{"dbias", &cv.dbias}}) {
    if (v->buffer.empty()) continue;
    const bool shared =
        std::any_of(data.begin(), data.end(), [&](const ViewSpec* d) { return d->buffer == v->buffer; });
    if (shared) {
      if (cv.bias_dtype != spec.dtype)
        return Status(StatusCode::invalid_argument,
                      std::string("--") + name + " " + format_view(*v) + ": buffer '" + v->buffer +
                          "' also holds the case's " + std::string(to_string(spec.dtype)) +
                          " tensors but the bias dtype is " + std::string(to_string(cv.bias_dtype)) +
                          "; give the bias a buffer of its own or the case's dtype");
      data.push_back(v);
    } else {
      std::int64_t& e = own[v->buffer];
      e = std::max(e, required_extent(*v));
    }
  }
  p->bufs.allocate(data, spec.dtype);
  p->bufs.allocate_named(kLseBuffer, DType::f32, required_extent(cv.lse));
  for (const auto& [name, extent] : own) p->bufs.allocate_named(name, cv.bias_dtype, extent);
  for (const ViewSpec* v : {&cv.alibi, &cv.sinks, &cv.max_logit, &cv.d_sinks})
    if (!v->buffer.empty()) p->bufs.allocate_named(v->buffer, DType::f32, required_extent(*v));
  return Status::Ok();
}

}  // namespace

Status prepare(const CaseSpec& spec, Prepared* p, detail::Problem* fwd, detail::Problem* bwd, bool with_reference) {
  p->cv = case_views(spec);
  const char* names[] = {"q", "k", "v", "o", "do", "dq", "dk", "dv"};
  const std::vector<const ViewSpec*> views = p->cv.data_views();
  for (std::size_t i = 0; i < views.size(); ++i)
    if (Status s = check_view_bounds(names[i], *views[i]); !s.ok()) return s;
  for (auto [name, v] : {std::pair{"bias", &p->cv.bias}, std::pair{"dbias", &p->cv.dbias}})
    if (!v->buffer.empty())
      if (Status s = check_view_bounds(name, *v); !s.ok()) return s;
  if (required_extent(p->cv.lse) > kMaxBufferElems)
    return Status(StatusCode::invalid_argument,
                  "--q " + format_view(*p->cv.q) +
                      ": its LSE (batch x heads x seqlen, one value "
                      "per row) needs more than 2^33 elements; the harness allocates at most that");
  // Memory of the buffers (and the reference's results) before allocating them; the
  // reference's scratch after its work check, which is the clearer refusal of a stride-0
  // K and V over a huge key count.
  const HostMemoryEstimate need = estimate_host_memory(spec, with_reference);
  const std::int64_t keys = std::max<std::int64_t>(p->cv.k->shape[kSeq], 0);
  HostMemoryEstimate before = need;
  before.scratch = 0;
  if (Status s = check_host_memory(before, keys); !s.ok()) return s;
  if (Status s = allocate_buffers(spec, p); !s.ok()) return s;
  const ProblemSizes& z = spec.sizes;
  const std::int64_t n_seq = std::int64_t(z.seqlens_q.size());
  if (spec.cu_seqlens && z.varlen()) p->bufs.allocate_named(kCuSeqlensBuffer, DType::f32, 4 * n_seq + 2);
  p->bufs.fill_random(spec.seed);
  if (Status s = apply_input_draws(spec, p); !s.ok()) return s;
  if (!p->cv.alibi.buffer.empty()) {  // ALiBi's slopes are positive: |normal| / 4
    HostBuffer& a = p->bufs.at(kAlibiBuffer);
    float* x = static_cast<float*>(a.data());
    for (std::int64_t i = 0; i < a.extent(); ++i) x[i] = std::fabs(x[i]) / 4;
  }
  if (spec.cu_seqlens && z.varlen()) {
    // The lists as int32 arrays: prefix sums of the lengths, then the first tokens.
    if (z.seqlens_kv.size() != z.seqlens_q.size() ||
        (!z.offsets_q.empty() && z.offsets_q.size() != z.seqlens_q.size()) ||
        (!z.offsets_kv.empty() && z.offsets_kv.size() != z.seqlens_q.size()))
      return Status(StatusCode::invalid_argument, "--cu-seqlens: the varlen lists must have one entry per sequence");
    std::vector<std::int64_t> all;
    for (const auto* lens : {&z.seqlens_q, &z.seqlens_kv}) {
      std::int64_t sum = 0;
      all.push_back(0);
      for (auto x : *lens) all.push_back(sum += x);
    }
    for (const auto* offs : {&z.offsets_q, &z.offsets_kv})
      for (std::int64_t i = 0; i < n_seq; ++i) all.push_back(offs->empty() ? 0 : (*offs)[std::size_t(i)]);
    auto* out = static_cast<std::int32_t*>(p->bufs.at(kCuSeqlensBuffer).data());
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i] < 0 || all[i] > std::numeric_limits<std::int32_t>::max())
        return Status(StatusCode::invalid_argument,
                      "--cu-seqlens: lengths and offsets must fit in int32 (found " + std::to_string(all[i]) + ")");
      out[i] = std::int32_t(all[i]);
    }
  }
  p->pristine = p->bufs.save();
  const Bases hb = host_bases(p->bufs);
  if (Status s = detail::make_problem(forward_args(spec, p->cv, hb, Backend::reference, Memory::host), fwd); !s.ok())
    return s;
  if (with_reference)
    if (Status s = check_reference_work(*fwd); !s.ok()) return s;
  p->flops = fwd->flops();
  if (spec.grad) {
    if (Status s = detail::make_problem(backward_args(spec, p->cv, hb, Backend::reference, Memory::host), bwd); !s.ok())
      return s;
    if (with_reference)
      if (Status s = check_reference_work(*bwd); !s.ok()) return s;
    p->flops += bwd->flops();
  }
  return check_host_memory(need, keys);
}

}  // namespace strideattn::harness::internal

namespace strideattn::harness {

using namespace internal;

HostMemoryEstimate estimate_host_memory(const CaseSpec& spec, bool with_reference) {
  const CaseViews cv = case_views(spec);
  std::map<std::string, std::int64_t> extent;
  for (const ViewSpec* v : cv.data_views()) {
    std::int64_t& e = extent[v->buffer];
    e = std::max(e, required_extent(*v));
  }
  // buffer, pristine copy, snapshot (dtype bytes each) and output mask (1 byte) per element
  const double per_elem = 3.0 * double(size_of(spec.dtype)) + 1.0;
  HostMemoryEstimate e;
  e.buffers = (double(required_extent(cv.lse)) + 2.0 * kGuardElems) * (3.0 * 4 + 1);
  for (const auto& [name, n] : extent) e.buffers += (double(n) + 2.0 * kGuardElems) * per_elem;
  for (const ViewSpec* v : {&cv.bias, &cv.dbias, &cv.alibi, &cv.sinks, &cv.max_logit, &cv.d_sinks})
    if (!v->buffer.empty()) e.buffers += (double(required_extent(*v)) + 2.0 * kGuardElems) * (3.0 * 4 + 1);
  if (!with_reference) return e;
  // Per logical output element: exact, naive and per-backend targets, read-back, offsets.
  std::vector<const ViewSpec*> outputs = {cv.o, &cv.lse};
  if (cv.grad) outputs.insert(outputs.end(), {cv.dq, cv.dk, cv.dv});
  for (const ViewSpec* v : {&cv.max_logit, &cv.dbias, &cv.d_sinks})
    if (!v->buffer.empty()) outputs.push_back(v);
  for (const ViewSpec* v : outputs) e.reference += 64.0 * double(numel(*v));
  // The reference copies one head's K and V rows (fp64) per thread; with grad each live task
  // also holds its dK/dV partials (a GQA group's stay until the group is reduced).
  const auto pos = [](std::int64_t x) { return double(std::max<std::int64_t>(x, 0)); };
  const double threads = std::max(1u, std::thread::hardware_concurrency());
  const double group = std::max(1.0, pos(cv.q->shape[kHead])) / std::max(1.0, pos(cv.k->shape[kHead]));
  e.scratch = 8.0 * pos(cv.k->shape[kSeq]) * (pos(cv.q->shape[kHeadDim]) + pos(cv.v->shape[kHeadDim])) *
              (cv.grad ? 2.0 * (threads + group) : threads);
  return e;
}

}  // namespace strideattn::harness
