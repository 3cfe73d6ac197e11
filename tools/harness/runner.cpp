// One attention case end to end (runner.hpp): each backend run on host memory or a device
// mirror (device_mirror.cpp) over the case's prepared buffers (case_setup.cpp), its outputs
// checked against the fp64 reference (verify.cpp); and explain_case. The benchmark is in
// bench_case.cpp, the reproducer line in reproducer.cpp.
#include "harness/runner.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/reference/reference.hpp"
#include "harness/case_setup.hpp"
#include "harness/device_mirror.hpp"
#include "harness/feature_allowance.hpp"
#include "harness/verify.hpp"
#include "problem/problem.hpp"

namespace strideattn::harness {

using namespace internal;

namespace {

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
  const std::vector<const ViewSpec*> feature_in = cv.feature_inputs();
  inputs.insert(inputs.end(), feature_in.begin(), feature_in.end());
  std::vector<const ViewSpec*> fwd_out = {cv.o, &cv.lse};
  for (const ViewSpec* v : cv.forward_feature_outputs()) fwd_out.push_back(v);
  p.bufs.prepare_outputs(fwd_out, {}, inputs);
  DeviceMirror dev;
  if (gpu)
    if (Status s = dev.upload(p.bufs); !s.ok()) return fail(s, "forward");
  const Bases bases = gpu ? dev.bases() : host_bases(p.bufs);
  ForwardArgs fargs = forward_args(spec, cv, bases, b, mem);
  BackwardArgs bargs = spec.grad ? backward_args(spec, cv, bases, b, mem) : BackwardArgs{};
  if (spec.cu_seqlens && varlen) {
    use_cu_seqlens(spec, bases, &fargs.varlen);
    bargs.varlen = fargs.varlen;
  }
  if (b == Backend::automatic) r.chosen = explain(fargs).chosen;
  Clock::time_point t0 = Clock::now();
  Status s = run_forward(spec, fargs);
  if (s.ok() && gpu) s = device_sync();
  double elapsed = ms_since(t0);
  if (!s.ok()) return fail(s, "forward");
  if (gpu)
    if (Status d = dev.download(p.bufs); !d.ok()) return fail(d, "forward");
  apply_plant(spec, p, {"o", "lse", "max_logit"});
  apply_run_check(p.bufs.check_after_run(), "forward", &r, &failures);
  const auto terms = [&](const std::vector<double>& a, const std::vector<std::uint8_t>& o) {
    return t.use_conditioning ? ElementTerms{&a, &o} : ElementTerms{};
  };
  std::vector<Expected> fwd_expected = {
      {"o", cv.o, &t.exact.o, &t.naive.o, -1.0, terms(t.cond.o, t.cond.o_overflow)},
      {"lse", &cv.lse, &t.exact.lse, &t.naive.lse, -1.0, terms(t.cond.lse, t.cond.lse_overflow)}};
  if (!cv.max_logit.buffer.empty())
    fwd_expected.push_back({"max_logit", &cv.max_logit, &t.exact_max_logit, &t.naive_max_logit, -1.0, {}});
  check_outputs(p.bufs, fwd_expected, varlen, inputs_non_finite(spec), &r, &failures);

  if (spec.grad) {
    // The answer key for the backward: from this backend's O where the rule says so.
    detail::ReferenceOutputs given_exact, given_naive;
    Conditioning given_cond;
    const detail::ReferenceOutputs* bexact = &t.exact;
    const detail::ReferenceOutputs* bnaive = &t.naive;
    const Conditioning* bcond = &t.cond;
    if (t.per_backend) {
      given_exact = detail::reference_compute(*t.backward, detail::RefPrecision::exact, t.inputs);
      given_naive = detail::reference_compute(*t.backward, detail::RefPrecision::naive_lowp, t.inputs);
      if (t.use_conditioning)
        given_cond = conditioning(*t.backward, false, true, t.inputs == detail::RefBackwardInputs::given_o);
      bexact = &given_exact;
      bnaive = &given_naive;
      bcond = &given_cond;
    }
    const double grad_scale =
        std::max({max_abs_finite(bexact->dq), max_abs_finite(bexact->dk), max_abs_finite(bexact->dv),
                  max_abs_finite(bexact->dbias), max_abs_finite(bexact->d_sinks)});
    // O is an input of the backward: where the forward's O is not finite (fp32 overflow, which
    // the forward's check allowed), the backward's inputs are not finite either.
    bool o_non_finite = false;
    for (double x : read_view(p.bufs.at(cv.o->buffer), *cv.o)) o_non_finite = o_non_finite || !std::isfinite(x);
    const bool bwd_non_finite = inputs_non_finite(spec) || o_non_finite;
    // Backward on this backend's own O and LSE, with poisoned dQ, dK, dV.
    std::vector<const ViewSpec*> bwd_in = {cv.q, cv.k, cv.v, cv.o, cv.d_o, &cv.lse};
    bwd_in.insert(bwd_in.end(), feature_in.begin(), feature_in.end());
    std::vector<const ViewSpec*> bwd_out = {cv.dq, cv.dk, cv.dv};
    for (const ViewSpec* v : cv.backward_feature_outputs()) bwd_out.push_back(v);
    p.bufs.prepare_outputs(bwd_out, {}, bwd_in);
    if (gpu)
      if (Status u = dev.upload(p.bufs); !u.ok()) return fail(u, "backward");
    t0 = Clock::now();
    s = run_backward(spec, bargs);
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
      apply_plant(spec, p, {"dq", "dk", "dv", "dbias", "d_sinks"});
      apply_run_check(p.bufs.check_after_run(), "backward", &r, &failures);
      std::vector<Expected> bwd_expected = {
          {"dq", cv.dq, &bexact->dq, &bnaive->dq, grad_scale, terms(bcond->dq, bcond->dq_overflow)},
          {"dk", cv.dk, &bexact->dk, &bnaive->dk, grad_scale, terms(bcond->dk, bcond->dk_overflow)},
          {"dv", cv.dv, &bexact->dv, &bnaive->dv, grad_scale, terms(bcond->dv, bcond->dv_overflow)}};
      // dBias and d_sink sum dS-like terms over rows (and broadcast dimensions): the fp32
      // rounding of those sums is at the scale of the gradients, whatever their own size.
      std::vector<double> dbias_allow;
      if (!cv.dbias.buffer.empty()) {
        dbias_allow = dbias_allowance(*t.backward, t.inputs);
        bwd_expected.push_back({"dbias",
                                &cv.dbias,
                                &bexact->dbias,
                                &bnaive->dbias,
                                grad_scale,
                                {dbias_allow.empty() ? nullptr : &dbias_allow, nullptr}});
      }
      if (!cv.d_sinks.buffer.empty())
        bwd_expected.push_back({"d_sinks", &cv.d_sinks, &bexact->d_sinks, &bnaive->d_sinks, grad_scale, {}});
      check_outputs(p.bufs, bwd_expected, varlen, bwd_non_finite, &r, &failures);
    }
  }
  r.time_ms = elapsed;
  r.tflops = elapsed > 0 ? p.flops / (elapsed * 1e9) : 0;
  if (failures.empty()) {
    r.status = "ok";
  } else {
    r.status = "mismatch";
    for (std::size_t i = 0; i < failures.size(); ++i) r.reason += (i ? "; " : "") + failures[i];
  }
  return r;
}

}  // namespace

// ------------------------------------------------------------------- public

bool CaseReport::all_ok() const {
  return std::all_of(backends.begin(), backends.end(),
                     [](const BackendResult& r) { return r.status == "ok" || r.status == "unsupported"; });
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
    t.per_backend = spec.grad && (t.inputs == detail::RefBackwardInputs::given_o || p.cv.d_o->buffer == p.cv.o->buffer);
    const detail::Problem& ref_problem = spec.grad && !t.per_backend ? bwd : fwd;
    say("computing the fp64 reference");
    t.exact = detail::reference_compute(ref_problem, detail::RefPrecision::exact);
    t.naive = detail::reference_compute(ref_problem, detail::RefPrecision::naive_lowp);
    t.use_conditioning = !features_change_scores(spec);
    if (t.use_conditioning) {
      say("computing the conditioning allowances");
      t.cond = conditioning(ref_problem, true, spec.grad && !t.per_backend, false);
    }
    if (p.cv.max_logit.buffer.empty()) {
    } else if (&ref_problem == &fwd) {
      t.exact_max_logit = t.exact.max_logit, t.naive_max_logit = t.naive.max_logit;
    } else {  // a backward problem has no max logit: the forward's
      t.exact_max_logit = detail::reference_compute(fwd, detail::RefPrecision::exact).max_logit;
      t.naive_max_logit = detail::reference_compute(fwd, detail::RefPrecision::naive_lowp).max_logit;
    }

    // The reference must produce every output, in the views' logical shapes.
    struct Want {
      const char* name;
      const std::vector<double>* e;
      const std::vector<double>* n;
      std::int64_t count;
    };
    std::vector<Want> wants = {{"o", &t.exact.o, &t.naive.o, numel(*p.cv.o)},
                               {"lse", &t.exact.lse, &t.naive.lse, numel(p.cv.lse)}};
    if (!p.cv.max_logit.buffer.empty())
      wants.push_back({"max_logit", &t.exact_max_logit, &t.naive_max_logit, numel(p.cv.max_logit)});
    if (spec.grad && !t.per_backend) {
      wants.push_back({"dq", &t.exact.dq, &t.naive.dq, numel(*p.cv.dq)});
      wants.push_back({"dk", &t.exact.dk, &t.naive.dk, numel(*p.cv.dk)});
      wants.push_back({"dv", &t.exact.dv, &t.naive.dv, numel(*p.cv.dv)});
      if (!p.cv.dbias.buffer.empty()) wants.push_back({"dbias", &t.exact.dbias, &t.naive.dbias, numel(p.cv.dbias)});
      if (!p.cv.d_sinks.buffer.empty())
        wants.push_back({"d_sinks", &t.exact.d_sinks, &t.naive.d_sinks, numel(p.cv.d_sinks)});
    }
    for (const Want& w : wants)
      if (std::int64_t(w.e->size()) != w.count || std::int64_t(w.n->size()) != w.count)
        return Status(StatusCode::internal, std::string("reference returned ") + std::to_string(w.e->size()) +
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
    if (bwd) *bwd = merged([&](Memory m) { return backward_args(s, p.cv, hb, Backend::automatic, m); });
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "out of host memory for the case's buffers");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("explain_case: ") + e.what());
  }
}

}  // namespace strideattn::harness
