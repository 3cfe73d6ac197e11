// One attention case end to end (runner.hpp): buffers with guard bands and fresh random
// inputs, poisoned outputs, each backend run on host memory or a device mirror, the
// written/guard checks, and the correctness rule against the fp64 reference. Also the
// benchmark protocol and the one-line reproducer.
#include "harness/runner.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <limits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "backends/reference/reference.hpp"
#include "harness/buffers.hpp"
#include "harness/checked.hpp"
#include "common/dtype.hpp"
#include "problem/problem.hpp"

#ifdef STRIDEATTN_HARNESS_CUDA
#include <cuda_runtime.h>
#endif

namespace strideattn::harness {

namespace {

const char* const kLseBuffer = "#lse";  // not a legal CLI buffer name: never collides

bool is_gpu(Backend b) { return b == Backend::cuda || b == Backend::cudnn; }
// Where a backend's tensors live: GPU backends, and `auto` when a GPU is present (what a
// caller with device tensors gets), use device mirrors.
bool on_device(Backend b) {
  return is_gpu(b) || (b == Backend::automatic && gpu_available());
}

std::string fmt(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

// The views a case uses, and the LSE as a pseudo-view [b, h, s_q, 1] of its fp32 buffer.
struct CaseViews {
  const ViewSpec *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
  ViewSpec lse;
  bool grad = false;
  [[nodiscard]] std::vector<const ViewSpec*> data_views() const {
    if (grad) return {q, k, v, o, d_o, dq, dk, dv};
    return {q, k, v, o};
  }
};

CaseViews case_views(const CaseSpec& spec) {
  CaseViews cv{&spec.views.q,  &spec.views.k,  &spec.views.v,  &spec.views.o,
               &spec.views.d_o, &spec.views.dq, &spec.views.dk, &spec.views.dv, {}, spec.grad};
  const std::int64_t b = spec.views.q.shape[kBatch], s = spec.views.q.shape[kSeq];
  const std::int64_t h = spec.views.q.shape[kHead];
  cv.lse.buffer = kLseBuffer;
  cv.lse.shape = {b, h, s, 1};
  cv.lse.stride = {checked_mul(h, s).value_or(kInt64Max), s, 1, 1};  // prepare() bounds it
  return cv;
}

// Logical elements of a view; kInt64Max when that does not fit.
std::int64_t numel(const ViewSpec& v) {
  const auto pos = [](std::int64_t x) { return std::max<std::int64_t>(x, 0); };
  return checked_product({pos(v.shape[0]), pos(v.shape[1]), pos(v.shape[2]), pos(v.shape[3])})
      .value_or(kInt64Max);
}

// Element pointers: buffer name -> element 0 (host buffer or its device mirror).
using Bases = std::map<std::string, std::byte*>;

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
Args shared_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases, Backend backend,
                 Memory memory) {
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
  return a;
}

ForwardArgs forward_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases,
                         Backend backend, Memory memory) {
  return shared_args<ForwardArgs>(spec, cv, bases, backend, memory);
}

BackwardArgs backward_args(const CaseSpec& spec, const CaseViews& cv, const Bases& bases,
                           Backend backend, Memory memory) {
  BackwardArgs a = shared_args<BackwardArgs>(spec, cv, bases, backend, memory);
  a.d_o = tensor(bases, *cv.d_o, spec.dtype);
  a.dq = tensor(bases, *cv.dq, spec.dtype);
  a.dk = tensor(bases, *cv.dk, spec.dtype);
  a.dv = tensor(bases, *cv.dv, spec.dtype);
  return a;
}

Bases host_bases(BufferSet& bufs) {
  Bases b;
  for (auto& [name, buf] : bufs.all()) b[name] = static_cast<std::byte*>(buf.data());
  return b;
}

// The most elements the harness allocates for one buffer.
constexpr std::int64_t kMaxBufferElems = std::int64_t(1) << 33;

// A view must lie inside a buffer the harness can allocate: no element before element 0
// (negative offsets or strides), none at or past kMaxBufferElems (an empty view: its offset).
Status check_view_bounds(const char* tensor_name, const ViewSpec& v) {
  const std::string what = std::string("--") + tensor_name + " " + format_view(v);
  if (v.buffer.empty()) return Status(StatusCode::invalid_argument, what + ": no buffer name");
  if (v.offset < 0)
    return Status(StatusCode::invalid_argument,
                  what + ": offset " + std::to_string(v.offset) + " is negative");
  const bool empty = std::any_of(v.shape.begin(), v.shape.end(), [](std::int64_t n) { return n <= 0; });
  const std::int64_t extent = required_extent(v);  // saturates at kInt64Max
  if (extent > kMaxBufferElems)
    return Status(StatusCode::invalid_argument,
                  what + (empty ? ": starts at element " + std::to_string(v.offset)
                                : ": reaches element " + (extent == kInt64Max
                                                              ? std::string("2^63 - 1 or beyond")
                                                              : std::to_string(extent - 1))) +
                      " of buffer '" + v.buffer + "'; the harness allocates at most 2^33 "
                      "elements per buffer");
  if (empty) return Status::Ok();
  // 128-bit arithmetic, each term clamped to +-2^100: huge strides give a message, not UB.
  constexpr __int128 kClamp = __int128(1) << 100;
  __int128 lowest = v.offset;
  for (int i = 0; i < 4; ++i)
    if (v.stride[i] < 0)
      lowest += std::max(__int128(v.shape[i] - 1) * v.stride[i], -kClamp);
  if (lowest < 0)
    return Status(StatusCode::invalid_argument,
                  what + ": reaches element " +
                      (lowest < INT64_MIN ? std::string("below -2^63")
                                          : std::to_string(std::int64_t(lowest))) +
                      " before the start of buffer '" + v.buffer +
                      "'; offsets and strides must keep every element at index >= 0");
  return Status::Ok();
}

// -------------------------------------------------------------------- device mirror

#ifdef STRIDEATTN_HARNESS_CUDA
std::string cuda_msg(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}
#endif

// Device copies of every host buffer (guard bands included), same layout.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror() {
#ifdef STRIDEATTN_HARNESS_CUDA
    for (auto& [name, p] : raw_) (void)cudaFree(p);
#endif
  }
  [[nodiscard]] Status upload(BufferSet& bufs) {
#ifdef STRIDEATTN_HARNESS_CUDA
    for (auto& [name, buf] : bufs.all()) {
      void*& p = raw_[name];
      if (!p) {
        if (cudaError_t e = cudaMalloc(&p, buf.total_bytes()); e != cudaSuccess) {
          p = nullptr;
          return Status(StatusCode::backend_error, cuda_msg("cudaMalloc", e));
        }
      }
      if (cudaError_t e = cudaMemcpy(p, buf.raw(), buf.total_bytes(), cudaMemcpyHostToDevice);
          e != cudaSuccess)
        return Status(StatusCode::backend_error, cuda_msg("cudaMemcpy to device", e));
      bases_[name] = static_cast<std::byte*>(p) + kGuardElems * std::int64_t(size_of(buf.dtype()));
    }
    return Status::Ok();
#else
    (void)bufs;
    return Status(StatusCode::unsupported, "built without CUDA");
#endif
  }
  [[nodiscard]] Status download(BufferSet& bufs) {
#ifdef STRIDEATTN_HARNESS_CUDA
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
      return Status(StatusCode::backend_error, cuda_msg("after the run", e));
    for (auto& [name, buf] : bufs.all())
      if (cudaError_t e = cudaMemcpy(buf.raw(), raw_.at(name), buf.total_bytes(),
                                     cudaMemcpyDeviceToHost);
          e != cudaSuccess)
        return Status(StatusCode::backend_error, cuda_msg("cudaMemcpy to host", e));
    return Status::Ok();
#else
    (void)bufs;
    return Status(StatusCode::unsupported, "built without CUDA");
#endif
  }
  [[nodiscard]] const Bases& bases() const { return bases_; }

 private:
  std::map<std::string, void*> raw_;
  Bases bases_;
};

Status device_sync() {
#ifdef STRIDEATTN_HARNESS_CUDA
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    return Status(StatusCode::backend_error, cuda_msg("cudaDeviceSynchronize", e));
#endif
  return Status::Ok();
}

// Why a backend cannot run in this process at all (empty when it can).
std::string unavailable_reason(Backend b) {
  if (b == Backend::automatic) return {};
  if (is_gpu(b)) {
#ifndef STRIDEATTN_HARNESS_CUDA
    return "built without CUDA";
#else
    if (!backend_compiled(b))
      return b == Backend::cudnn ? "built without cuDNN" : "built without CUDA";
    if (!gpu_available()) return "no GPU present";
#endif
  }
  if (!backend_compiled(b)) return "backend not compiled into this build";
  return {};
}

// ------------------------------------------------------------------- checking

// "o[b=0,s=17,h=3,d=5]" for the logical row-major index of a tensor's view.
std::string element_name(const std::string& tensor, const ViewSpec& v, std::int64_t index,
                         bool varlen) {
  if (index < 0) return tensor;
  std::int64_t idx[4];
  std::int64_t rest = index;
  for (int i = 3; i >= 0; --i) {
    const std::int64_t n = std::max<std::int64_t>(v.shape[i], 1);
    idx[i] = rest % n;
    rest /= n;
  }
  std::ostringstream os;
  if (tensor == "lse")
    os << "lse[b=" << idx[0] << ",h=" << idx[1] << (varlen ? ",t=" : ",s=") << idx[2] << "]";
  else
    os << tensor << "[b=" << idx[0] << (varlen ? ",t=" : ",s=") << idx[1] << ",h=" << idx[2]
       << ",d=" << idx[3] << "]";
  return os.str();
}

struct Expected {
  std::string name;
  const ViewSpec* view;
  const std::vector<double>* exact;
  const std::vector<double>* naive;  // the naive low-precision model: sets the tolerance
  double magnitude = -1.0;           // scale of the relative term (compare.hpp check_tensor)
};

std::string describe_failure(const TensorCheck& c, const ViewSpec& v, bool varlen) {
  std::string s = element_name(c.name, v, c.err.worst_index, varlen) + " = " +
                  fmt(c.err.worst_value) + " vs " + fmt(c.err.worst_expected) + " (tol " +
                  fmt(c.tol) + ")";
  if (c.err.non_finite > 0)
    s = c.name + ": " + std::to_string(c.err.non_finite) +
        " non-finite value(s) where the reference is finite (or vice versa); worst " + s;
  return s;
}

// Compares the written outputs with the reference; appends to r.checks and r.reason.
// `inputs_non_finite`, `overflow_possible`: compare.hpp NonFinitePolicy.
void check_outputs(const BufferSet& bufs, const std::vector<Expected>& expected, bool varlen,
                   bool inputs_non_finite, bool overflow_possible, BackendResult* r,
                   std::vector<std::string>* failures) {
  for (const Expected& e : expected) {
    const DType stored = e.name == "lse" ? DType::f32 : bufs.at(e.view->buffer).dtype();
    TensorCheck c =
        check_tensor(e.name, stored, read_view(bufs.at(e.view->buffer), *e.view), *e.naive, *e.exact,
                     e.magnitude, inputs_non_finite, overflow_possible);
    if (!c.pass()) failures->push_back(describe_failure(c, *e.view, varlen));
    r->checks.push_back(std::move(c));
  }
}

void apply_run_check(const BufferSet::CheckResult& ck, const char* phase, BackendResult* r,
                     std::vector<std::string>* failures) {
  if (!ck.written_ok) {
    r->written_ok = false;
    failures->push_back(std::string(phase) + ": " + ck.written_msg);
  }
  if (!ck.guard_ok) {
    r->guard_ok = false;
    failures->push_back(std::string(phase) + ": " + ck.guard_msg);
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Whether some fp32 summation order of a score (d_qk products of |q| |k|, times the scale
// when that is above 1) or of dP = dO V^T can come within 8x of FLT_MAX on these inputs:
// then backends that sum in another order than the naive model may overflow where it does
// not (docs/semantics.md, "fp32 overflow is never a finite wrong answer").
bool fp32_may_overflow(const CaseSpec& spec, const BufferSet& bufs) {
  auto max_abs = [&](const ViewSpec* v) {
    double m = 0;
    for (double x : read_view(bufs.at(v->buffer), *v))
      if (std::isfinite(x)) m = std::max(m, std::fabs(x));
    return m;
  };
  const double limit = double(std::numeric_limits<float>::max()) / 8;
  const double scale = std::max(1.0, spec.options.scale.value_or(1.0));
  const double s = max_abs(&spec.views.q) * max_abs(&spec.views.k) * double(spec.sizes.d_qk) * scale;
  double dp = 0;
  if (spec.grad) dp = max_abs(&spec.views.d_o) * max_abs(&spec.views.v) * double(spec.sizes.d_v);
  return s > limit || dp > limit;
}

bool inputs_non_finite(const CaseSpec& spec) {
  return std::any_of(spec.input_plants.begin(), spec.input_plants.end(),
                     [](const CaseSpec::InputPlant& pl) { return !std::isfinite(pl.value); });
}

// Everything one case shares between its backends.
struct Prepared {
  BufferSet bufs;
  std::map<std::string, std::vector<std::byte>> pristine;
  CaseViews cv;
  double flops = 0;  // forward, plus backward with grad
  bool overflow_possible = false;  // fp32_may_overflow()
};

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
    parts += ", " + gib(e.scratch) + " for the reference's copies of K and V (" +
             std::to_string(keys) + " keys) on each thread";
  return Status(StatusCode::invalid_argument,
                "the case needs about " + gib(e.total()) + " of host memory: " + parts +
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
      if (name == kLseBuffer) continue;
      for (std::int64_t i = 0; i < buf.extent(); ++i) {
        const float x = detail::load_as_float(buf.data(), buf.dtype(), i);
        detail::store_from_float(buf.data(), buf.dtype(), i, float(double(x) * spec.input_scale));
      }
    }
  for (const CaseSpec::InputPlant& pl : spec.input_plants) {
    const ViewSpec* v = pl.tensor == "q"   ? p->cv.q
                        : pl.tensor == "k" ? p->cv.k
                        : pl.tensor == "v" ? p->cv.v
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
  os << "the fp64 reference would need about " << flop << " FLOP for this case's "
     << to_string(problem.direction) << " (every query against every visible key, "
     << problem.visible_pairs() << " pairs); the harness checks cases of at most " << kMaxFlop
     << " FLOP (the reference backend's limit)";
  return Status(StatusCode::invalid_argument, os.str());
}

Status prepare(const CaseSpec& spec, Prepared* p, detail::Problem* fwd, detail::Problem* bwd,
               bool with_reference) {
  p->cv = case_views(spec);
  const char* names[] = {"q", "k", "v", "o", "do", "dq", "dk", "dv"};
  const std::vector<const ViewSpec*> views = p->cv.data_views();
  for (std::size_t i = 0; i < views.size(); ++i)
    if (Status s = check_view_bounds(names[i], *views[i]); !s.ok()) return s;
  if (required_extent(p->cv.lse) > kMaxBufferElems)
    return Status(StatusCode::invalid_argument,
                  "--q " + format_view(*p->cv.q) + ": its LSE (batch x heads x seqlen, one value "
                  "per row) needs more than 2^33 elements; the harness allocates at most that");
  // Memory of the buffers (and the reference's results) before allocating them; the
  // reference's scratch after its work check, which is the clearer refusal of a stride-0
  // K and V over a huge key count.
  const HostMemoryEstimate need = estimate_host_memory(spec, with_reference);
  const std::int64_t keys = std::max<std::int64_t>(p->cv.k->shape[kSeq], 0);
  HostMemoryEstimate before = need;
  before.scratch = 0;
  if (Status s = check_host_memory(before, keys); !s.ok()) return s;
  p->bufs.allocate(views, spec.dtype);
  p->bufs.allocate_named(kLseBuffer, DType::f32, required_extent(p->cv.lse));
  p->bufs.fill_random(spec.seed);
  if (Status s = apply_input_draws(spec, p); !s.ok()) return s;
  p->overflow_possible = spec.input_scale != 1.0 && fp32_may_overflow(spec, p->bufs);
  p->pristine = p->bufs.save();
  const Bases hb = host_bases(p->bufs);
  if (Status s = detail::make_problem(
          forward_args(spec, p->cv, hb, Backend::reference, Memory::host), fwd);
      !s.ok())
    return s;
  if (with_reference)
    if (Status s = check_reference_work(*fwd); !s.ok()) return s;
  p->flops = fwd->flops();
  if (spec.grad) {
    if (Status s = detail::make_problem(
            backward_args(spec, p->cv, hb, Backend::reference, Memory::host), bwd);
        !s.ok())
      return s;
    if (with_reference)
      if (Status s = check_reference_work(*bwd); !s.ok()) return s;
    p->flops += bwd->flops();
  }
  return check_host_memory(need, keys);
}

// The test hook of CaseSpec::plant, for the outputs of the phase that just ran.
void apply_plant(const CaseSpec& spec, Prepared& p, const std::vector<std::string>& phase) {
  if (!spec.plant) return;
  const CaseSpec::Plant& pl = *spec.plant;
  if (std::find(phase.begin(), phase.end(), pl.tensor) == phase.end()) return;
  const ViewSpec* v = pl.tensor == "o"    ? p.cv.o
                      : pl.tensor == "lse" ? &p.cv.lse
                      : pl.tensor == "dq"  ? p.cv.dq
                      : pl.tensor == "dk"  ? p.cv.dk
                                           : p.cv.dv;
  HostBuffer& buf = p.bufs.at(v->buffer);
  const std::vector<std::int64_t> offs = view_offsets(*v);
  if (offs.empty()) return;
  const std::int64_t at = offs[std::size_t(std::clamp<std::int64_t>(pl.index, 0, std::int64_t(offs.size()) - 1))];
  if (pl.kind == "value") {
    const float x = detail::load_as_float(buf.data(), buf.dtype(), at);
    detail::store_from_float(buf.data(), buf.dtype(), at, float(x + pl.delta));
  } else if (pl.kind == "unwritten") {
    buf.set_bits(at, poison_bits(buf.dtype()));
  } else if (pl.kind == "guard") {
    buf.set_bits(buf.extent(), buf.bits(buf.extent()) ^ 1u);
  }
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The fp64 answer key and the naive model of one case (see docs/semantics.md
// "Correctness rule"). Backward targets are either fixed per case (f32: the true gradient)
// or computed from the O each backend's forward produced (f16/bf16: backward_targets()).
// They are computed per backend too when the forward writes into dO's buffer (dO aliasing
// O): the targets must read the dO the backend's backward reads, after that forward.
struct Targets {
  detail::ReferenceOutputs exact, naive;  // forward; and backward when fixed per case
  const detail::Problem* backward = nullptr;  // on the host buffers (reads the current O, dO)
  bool per_backend = false;                   // backward targets after each backend's forward
  detail::RefBackwardInputs inputs = detail::RefBackwardInputs::recompute;
};

BackendResult run_one(const CaseSpec& spec, Prepared& p, Backend b, const Targets& t) {
  BackendResult r;
  r.backend = b;
  if (std::string why = unavailable_reason(b); !why.empty()) {
    r.status = "unsupported";
    r.reason = why;
    return r;
  }
  const bool gpu = on_device(b);
  const Memory mem = gpu ? Memory::device : Memory::host;
  const CaseViews& cv = p.cv;
  const bool varlen = spec.sizes.varlen();
  std::vector<std::string> failures;
  auto fail = [&](Status s, const char* phase) {
    r.status = s.code() == StatusCode::unsupported ? "unsupported" : "error";
    r.reason = std::string(phase) + ": " + s.message();
    return r;
  };

  // Forward on fresh inputs with poisoned O and LSE. With grad, dO is an input of the case
  // too: a dO in O's buffer keeps its values outside O (the buffer is not poisoned whole).
  p.bufs.restore(p.pristine);
  std::vector<const ViewSpec*> inputs = {cv.q, cv.k, cv.v};
  if (spec.grad) inputs.push_back(cv.d_o);
  p.bufs.prepare_outputs({cv.o, &cv.lse}, {}, inputs);
  DeviceMirror dev;
  if (gpu)
    if (Status s = dev.upload(p.bufs); !s.ok()) return fail(s, "forward");
  const Bases bases = gpu ? dev.bases() : host_bases(p.bufs);
  if (b == Backend::automatic) r.chosen = explain(forward_args(spec, cv, bases, b, mem)).chosen;
  Clock::time_point t0 = Clock::now();
  Status s = forward(forward_args(spec, cv, bases, b, mem));
  if (s.ok() && gpu) s = device_sync();
  double elapsed = ms_since(t0);
  if (!s.ok()) return fail(s, "forward");
  if (gpu)
    if (Status d = dev.download(p.bufs); !d.ok()) return fail(d, "forward");
  apply_plant(spec, p, {"o", "lse"});
  apply_run_check(p.bufs.check_after_run(), "forward", &r, &failures);
  check_outputs(p.bufs,
                {{"o", cv.o, &t.exact.o, &t.naive.o}, {"lse", &cv.lse, &t.exact.lse, &t.naive.lse}},
                varlen, inputs_non_finite(spec), p.overflow_possible, &r, &failures);

  if (spec.grad) {
    // The answer key for the backward: from this backend's O where the rule says so.
    detail::ReferenceOutputs given_exact, given_naive;
    const detail::ReferenceOutputs* bexact = &t.exact;
    const detail::ReferenceOutputs* bnaive = &t.naive;
    if (t.per_backend) {
      given_exact = detail::reference_compute(*t.backward, detail::RefPrecision::exact, t.inputs);
      given_naive =
          detail::reference_compute(*t.backward, detail::RefPrecision::naive_lowp, t.inputs);
      bexact = &given_exact;
      bnaive = &given_naive;
    }
    const double grad_scale = std::max({max_abs_finite(bexact->dq), max_abs_finite(bexact->dk),
                                        max_abs_finite(bexact->dv)});
    // Backward on this backend's own O and LSE, with poisoned dQ, dK, dV.
    p.bufs.prepare_outputs({cv.dq, cv.dk, cv.dv}, {},
                           {cv.q, cv.k, cv.v, cv.o, cv.d_o, &cv.lse});
    if (gpu)
      if (Status u = dev.upload(p.bufs); !u.ok()) return fail(u, "backward");
    t0 = Clock::now();
    s = backward(backward_args(spec, cv, bases, b, mem));
    if (s.ok() && gpu) s = device_sync();
    elapsed += ms_since(t0);
    if (!s.ok()) {
      // A forward mismatch outranks a backward that cannot run.
      if (!failures.empty()) {
        failures.push_back("backward: " + s.message());
      } else {
        return fail(s, "backward");
      }
    } else {
      if (gpu)
        if (Status d = dev.download(p.bufs); !d.ok()) return fail(d, "backward");
      apply_plant(spec, p, {"dq", "dk", "dv"});
      apply_run_check(p.bufs.check_after_run(), "backward", &r, &failures);
      check_outputs(p.bufs,
                    {{"dq", cv.dq, &bexact->dq, &bnaive->dq, grad_scale},
                     {"dk", cv.dk, &bexact->dk, &bnaive->dk, grad_scale},
                     {"dv", cv.dv, &bexact->dv, &bnaive->dv, grad_scale}},
                    varlen, inputs_non_finite(spec), p.overflow_possible, &r, &failures);
    }
  }
  r.time_ms = elapsed;
  r.tflops = elapsed > 0 ? p.flops / (elapsed * 1e9) : 0;
  if (failures.empty()) {
    r.status = "ok";
  } else {
    r.status = "mismatch";
    for (std::size_t i = 0; i < failures.size(); ++i)
      r.reason += (i ? "; " : "") + failures[i];
  }
  return r;
}

std::string join_backends(const std::vector<Backend>& backends) {
  std::string s;
  for (Backend b : backends) s += (s.empty() ? "" : ",") + std::string(to_string(b));
  return s;
}

bool same_view(const ViewSpec& a, const ViewSpec& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.shape == b.shape &&
         a.stride == b.stride;
}

std::string list(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

// ------------------------------------------------------------------- public

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
  if (!with_reference) return e;
  // Per logical output element: exact, naive and per-backend targets, read-back, offsets.
  std::vector<const ViewSpec*> outputs = {cv.o, &cv.lse};
  if (cv.grad) outputs.insert(outputs.end(), {cv.dq, cv.dk, cv.dv});
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

bool CaseReport::all_ok() const {
  return std::all_of(backends.begin(), backends.end(), [](const BackendResult& r) {
    return r.status == "ok" || r.status == "unsupported";
  });
}

bool gpu_available() {
#ifdef STRIDEATTN_HARNESS_CUDA
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
#else
  return false;
#endif
}

Status run_case(const CaseSpec& spec, const std::vector<Backend>& backends, CaseReport* report,
                const Progress& progress) {
  const auto say = [&](const std::string& what) {
    if (progress) progress(what);
  };
  if (report == nullptr) return Status(StatusCode::invalid_argument, "run_case: report is null");
  *report = CaseReport{};
  try {
    Prepared p;
    detail::Problem fwd, bwd;
    if (Status s = prepare(spec, &p, &fwd, &bwd, true); !s.ok()) return s;
    {
      const Bases hb = host_bases(p.bufs);
      Explanation ex = explain(forward_args(spec, p.cv, hb, Backend::automatic, Memory::host));
      report->layout = ex.layout;
    }
    // Forward targets, and backward targets when they depend on neither the backend's O nor
    // a dO the forward writes.
    Targets t;
    t.backward = &bwd;
    t.inputs = detail::backward_targets(spec.dtype);
    t.per_backend = spec.grad && (t.inputs == detail::RefBackwardInputs::given_o ||
                                  p.cv.d_o->buffer == p.cv.o->buffer);
    const detail::Problem& ref_problem = spec.grad && !t.per_backend ? bwd : fwd;
    say("computing the fp64 reference");
    t.exact = detail::reference_compute(ref_problem, detail::RefPrecision::exact);
    t.naive = detail::reference_compute(ref_problem, detail::RefPrecision::naive_lowp);

    // The reference must produce every output, in the views' logical shapes.
    struct Want {
      const char* name;
      const std::vector<double>* e;
      const std::vector<double>* n;
      std::int64_t count;
    };
    std::vector<Want> wants = {{"o", &t.exact.o, &t.naive.o, numel(*p.cv.o)},
                               {"lse", &t.exact.lse, &t.naive.lse, numel(p.cv.lse)}};
    if (spec.grad && !t.per_backend) {
      wants.push_back({"dq", &t.exact.dq, &t.naive.dq, numel(*p.cv.dq)});
      wants.push_back({"dk", &t.exact.dk, &t.naive.dk, numel(*p.cv.dk)});
      wants.push_back({"dv", &t.exact.dv, &t.naive.dv, numel(*p.cv.dv)});
    }
    for (const Want& w : wants)
      if (std::int64_t(w.e->size()) != w.count || std::int64_t(w.n->size()) != w.count)
        return Status(StatusCode::internal,
                      std::string("reference returned ") + std::to_string(w.e->size()) +
                          " values for " + w.name + ", expected " + std::to_string(w.count));
    for (std::size_t i = 0; i < backends.size(); ++i) {
      say("running " + std::string(to_string(backends[i])) + " (" + std::to_string(i + 1) + "/" +
          std::to_string(backends.size()) + ")");
      report->backends.push_back(run_one(spec, p, backends[i], t));
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "out of host memory for the case's buffers");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("run_case: ") + e.what());
  }
}

Status explain_case(const CaseSpec& spec, Explanation* fwd, Explanation* bwd) {
  if (fwd == nullptr) return Status(StatusCode::invalid_argument, "explain_case: fwd is null");
  try {
    CaseSpec s = spec;
    s.grad = bwd != nullptr;
    Prepared p;
    detail::Problem fp, bp;
    if (Status st = prepare(s, &p, &fp, &bp, false); !st.ok()) return st;
    const Bases hb = host_bases(p.bufs);
    // CPU backends are explained on host memory, GPU backends (when a GPU is present) on
    // device memory: the verdicts a caller with tensors in the right place would get.
    auto merged = [&](auto make_args) {
      Explanation ex = explain(make_args(Memory::host));
      if (!gpu_available() || !ex.validation.ok()) return ex;
      Explanation dev = explain(make_args(Memory::device));
      for (Verdict& v : ex.verdicts)
        if (is_gpu(v.backend))
          for (const Verdict& d : dev.verdicts)
            if (d.backend == v.backend) v = d;
      if (dev.chosen) ex.chosen = dev.chosen;
      return ex;
    };
    *fwd = merged([&](Memory m) { return forward_args(s, p.cv, hb, Backend::automatic, m); });
    if (bwd)
      *bwd = merged([&](Memory m) { return backward_args(s, p.cv, hb, Backend::automatic, m); });
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "out of host memory for the case's buffers");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("explain_case: ") + e.what());
  }
}

Status bench_case(const CaseSpec& spec, const std::vector<Backend>& backends, int runs,
                  std::vector<BenchResult>* results, const Progress& progress) {
  if (results == nullptr)
    return Status(StatusCode::invalid_argument, "bench_case: results is null");
  results->clear();
  runs = std::max(runs, 20);
  try {
    Prepared p;
    detail::Problem fwd, bwd;
    if (Status s = prepare(spec, &p, &fwd, &bwd, false); !s.ok()) return s;
    for (std::size_t bi = 0; bi < backends.size(); ++bi) {
      const Backend b = backends[bi];
      if (progress)
        progress("timing " + std::string(to_string(b)) + " (" + std::to_string(bi + 1) + "/" +
                 std::to_string(backends.size()) + ")");
      BenchResult r;
      r.backend = b;
      auto finish = [&](Status s) {
        r.status = s.code() == StatusCode::unsupported ? "unsupported" : "error";
        r.reason = s.message();
        results->push_back(r);
      };
      if (std::string why = unavailable_reason(b); !why.empty()) {
        finish(Status(StatusCode::unsupported, why));
        continue;
      }
      const bool gpu = on_device(b);
      const Memory mem = gpu ? Memory::device : Memory::host;
      p.bufs.restore(p.pristine);
      DeviceMirror dev;
      if (gpu)
        if (Status s = dev.upload(p.bufs); !s.ok()) {
          finish(s);
          continue;
        }
      const Bases bases = gpu ? dev.bases() : host_bases(p.bufs);
      const ForwardArgs fa = forward_args(spec, p.cv, bases, b, mem);
      const BackwardArgs ba =
          spec.grad ? backward_args(spec, p.cv, bases, b, mem) : BackwardArgs{};
      auto once = [&]() -> Status {
        if (Status s = forward(fa); !s.ok()) return s;
        if (spec.grad)
          if (Status s = backward(ba); !s.ok()) return s;
        return Status::Ok();
      };
      Status s = Status::Ok();
      const int warmup = gpu ? 3 : 1;
      for (int i = 0; i < warmup && s.ok(); ++i) s = once();
      if (s.ok() && gpu) s = device_sync();
      std::vector<double> times;
#ifdef STRIDEATTN_HARNESS_CUDA
      cudaEvent_t start = nullptr, stop = nullptr;
      if (gpu) {
        (void)cudaEventCreate(&start);
        (void)cudaEventCreate(&stop);
      }
#endif
      for (int i = 0; i < runs && s.ok(); ++i) {
        if (gpu) {
#ifdef STRIDEATTN_HARNESS_CUDA
          (void)cudaEventRecord(start, nullptr);
          s = once();
          (void)cudaEventRecord(stop, nullptr);
          if (cudaError_t e = cudaEventSynchronize(stop); e != cudaSuccess && s.ok())
            s = Status(StatusCode::backend_error, cuda_msg("timing event", e));
          float ms = 0;
          (void)cudaEventElapsedTime(&ms, start, stop);
          times.push_back(ms);
#endif
        } else {
          const Clock::time_point t0 = Clock::now();
          s = once();
          times.push_back(ms_since(t0));
        }
      }
#ifdef STRIDEATTN_HARNESS_CUDA
      if (gpu) {
        (void)cudaEventDestroy(start);
        (void)cudaEventDestroy(stop);
      }
#endif
      if (!s.ok()) {
        finish(s);
        continue;
      }
      r.status = "ok";
      r.runs = int(times.size());
      r.median_ms = median(times);
      r.tflops = r.median_ms > 0 ? p.flops / (r.median_ms * 1e9) : 0;
      results->push_back(r);
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "out of host memory for the case's buffers");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("bench_case: ") + e.what());
  }
}

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
  os << " --heads " << z.heads << " --kv-heads " << z.kv_heads << " --head-dim " << z.d_qk
     << " --head-dim-v " << z.d_v;
  LayoutViews made;
  const bool from_layout =
      !spec.layout_name.empty() && make_layout_views(spec.layout_name, z, &made).ok();
  if (from_layout) os << " --layout '" << spec.layout_name << "'";
  const std::pair<const char*, const ViewSpec*> given[] = {
      {"q", &spec.views.q},   {"k", &spec.views.k},   {"v", &spec.views.v},
      {"o", &spec.views.o},   {"do", &spec.views.d_o}, {"dq", &spec.views.dq},
      {"dk", &spec.views.dk}, {"dv", &spec.views.dv}};
  const ViewSpec* layout_view[] = {&made.q, &made.k, &made.v, &made.o,
                                   &made.d_o, &made.dq, &made.dk, &made.dv};
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
       << (std::isnan(pl.value) ? "nan" : pl.value > 0 ? "inf" : "-inf");
  }
  if (!backends.empty()) os << " --backends " << join_backends(backends);
  return os.str();
}

}  // namespace strideattn::harness
