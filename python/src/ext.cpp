// strideattn._ext: nanobind bindings from DLPack tensors (numpy, PyTorch, CuPy, JAX, ...) to
// the C++ API. Each tensor is read as a pointer plus its own element strides (no copies, no
// layout names). Calls return (status code name, message); the Python layer (_core.py) maps
// codes onto exceptions and allocates outputs in the caller's framework. Every call runs a plan
// from the extension's plan cache (keyed by everything but the pointers); a caller's workspace
// and varlen cu_seqlens arrays (device tensors) are taken as they are, as are the training
// features (bias, ALiBi slopes, sinks, max_logit, dbias, d_sinks); Plan objects run with
// integer addresses for the lowest per-call cost. Helpers shared with the KV-cache bindings
// (ext_kvcache.cpp) live in ext_common.hpp.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "ext_common.hpp"
#include "strideattn/strideattn.hpp"

namespace nb = nanobind;
using namespace strideattn;
using namespace strideattn::pyext;

namespace {

Varlen make_varlen(std::vector<std::int64_t> seqlens_q, std::vector<std::int64_t> seqlens_kv,
                   std::vector<std::int64_t> offsets_q, std::vector<std::int64_t> offsets_kv) {
  Varlen v;
  v.seqlens_q = std::move(seqlens_q);
  v.seqlens_kv = std::move(seqlens_kv);
  v.offsets_q = std::move(offsets_q);
  v.offsets_kv = std::move(offsets_kv);
  return v;
}

// Options shared by every entry point, in one struct so the bindings stay readable.
struct CallOptions {
  std::string mask = "none";
  std::int64_t window_left = -1, window_right = -1;
  std::optional<double> scale;
  bool deterministic = false;
  std::vector<std::int64_t> seqlens_q, seqlens_kv, offsets_q, offsets_kv;
  std::string backend = "auto";
  std::uintptr_t stream = 0;
  // A caller's workspace (any dtype; its bytes count), and varlen cu_seqlens arrays (int32,
  // 1-D, on the tensors' device) with the caller's bounds.
  std::optional<OutArray> workspace;
  std::optional<InArray> cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv;
  std::int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  FeatureOptions features;
};

// An int32 1-D array with unit stride on the call's device; `min_count` entries at least.
Status int32_array(const char* name, const InArray& a, Placement* p, std::int64_t min_count, const std::int32_t** out) {
  if (Status s = place(name, a, p); !s.ok()) return s;
  const nb::dlpack::dtype t = a.dtype();
  if (!(t.lanes == 1 && t.bits == 32 && static_cast<nb::dlpack::dtype_code>(t.code) == nb::dlpack::dtype_code::Int))
    return bad(std::string(name) + " has dtype " + dtype_name(t) + "; supported: int32");
  if (a.ndim() != 1) return bad(std::string(name) + " has " + std::to_string(a.ndim()) + " dimensions; supported: 1");
  if (a.shape(0) > 1 && a.stride(0) != 1)
    return bad(std::string(name) + " has stride " + std::to_string(a.stride(0)) + "; supported: 1 (contiguous)");
  if (std::int64_t(a.shape(0)) < min_count)
    return bad(std::string(name) + " has " + std::to_string(a.shape(0)) + " entries; supported: at least " +
               std::to_string(min_count) + " (count + 1 for cu_seqlens, count for seq_offsets)");
  *out = static_cast<const std::int32_t*>(a.data());
  return Status::Ok();
}

// The arrays of the options, placed with the tensors (`p`), into `vl`.
Status fill_cu_seqlens(const CallOptions& c, Placement* p, Varlen* vl) {
  const bool any = c.cu_seqlens_q || c.cu_seqlens_kv || c.seq_offsets_q || c.seq_offsets_kv;
  if (!any) {
    if (c.max_seqlen_q != 0 || c.max_seqlen_kv != 0)
      return bad("max_seqlen_q/max_seqlen_kv given without cu_seqlens_q/cu_seqlens_kv");
    return Status::Ok();
  }
  if (!c.cu_seqlens_q || !c.cu_seqlens_kv)
    return bad(std::string("cu_seqlens_") + (c.cu_seqlens_q ? "kv" : "q") +
               " is missing; supported: both cu_seqlens_q and cu_seqlens_kv (count + 1 entries each)");
  const std::int64_t n = std::int64_t(c.cu_seqlens_q->shape(0)) - 1;
  if (n < 1) return bad("cu_seqlens_q has " + std::to_string(n + 1) + " entries; supported: at least 2");
  if (std::int64_t(c.cu_seqlens_kv->shape(0)) != n + 1)
    return bad("cu_seqlens_kv has " + std::to_string(c.cu_seqlens_kv->shape(0)) + " entries but cu_seqlens_q has " +
               std::to_string(n + 1) + "; supported: the same count on both sides");
  vl->count = n;
  if (Status s = int32_array("cu_seqlens_q", *c.cu_seqlens_q, p, n + 1, &vl->cu_seqlens_q); !s.ok()) return s;
  if (Status s = int32_array("cu_seqlens_kv", *c.cu_seqlens_kv, p, n + 1, &vl->cu_seqlens_kv); !s.ok()) return s;
  if (c.seq_offsets_q)
    if (Status s = int32_array("seq_offsets_q", *c.seq_offsets_q, p, n, &vl->seq_offsets_q); !s.ok()) return s;
  if (c.seq_offsets_kv)
    if (Status s = int32_array("seq_offsets_kv", *c.seq_offsets_kv, p, n, &vl->seq_offsets_kv); !s.ok()) return s;
  vl->max_seqlen_q = c.max_seqlen_q;
  vl->max_seqlen_kv = c.max_seqlen_kv;
  return Status::Ok();
}

template <class Args>
Status fill_common(const CallOptions& c, Placement* p, Args* args) {
  if (Status s = parse_options(c.mask, c.window_left, c.window_right, c.scale, c.deterministic, &args->options);
      !s.ok())
    return s;
  if (Status s = parse_features(c.features, &args->options); !s.ok()) return s;
  if (Status s = parse_backend(c.backend, &args->backend); !s.ok()) return s;
  args->varlen = make_varlen(c.seqlens_q, c.seqlens_kv, c.offsets_q, c.offsets_kv);
  if (Status s = fill_cu_seqlens(c, p, &args->varlen); !s.ok()) return s;
  args->stream = reinterpret_cast<void*>(c.stream);
  if (c.workspace) {
    if (Status s = place("workspace", *c.workspace, p); !s.ok()) return s;
    std::int64_t expect = 1;  // its bytes are used as one block: row-major contiguous
    for (std::size_t i = c.workspace->ndim(); i-- > 0;) {
      if (c.workspace->shape(i) > 1 && c.workspace->stride(i) != expect)
        return bad("workspace: dimension " + std::to_string(i) + " has stride " +
                   std::to_string(c.workspace->stride(i)) + "; supported: a contiguous tensor");
      expect *= std::int64_t(c.workspace->shape(i));
    }
    args->workspace = c.workspace->data();
    args->workspace_bytes = c.workspace->nbytes();
  }
  return Status::Ok();
}

// The feature inputs both passes read: bias, ALiBi slopes, sinks, dropout's seed and offset
// tensor.
template <class Args>
Status fill_inputs(const FeatureOptions& f, Placement* p, Args* args) {
  if (f.bias)
    if (Status s = to_bias("bias", *f.bias, p, &args->bias); !s.ok()) return s;
  if (f.alibi_slopes)
    if (Status s = to_head("alibi_slopes", *f.alibi_slopes, p, &args->alibi_slopes); !s.ok()) return s;
  if (f.sinks)
    if (Status s = to_head("sinks", *f.sinks, p, &args->sinks); !s.ok()) return s;
  if (f.dropout_rng) {  // [seed, offset], read by the backend when the call runs
    const InArray& a = *f.dropout_rng;
    if (Status s = place("dropout_rng", a, p); !s.ok()) return s;
    const nb::dlpack::dtype t = a.dtype();
    const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
    if (!(t.lanes == 1 && t.bits == 64 &&
          (code == nb::dlpack::dtype_code::Int || code == nb::dlpack::dtype_code::UInt)))
      return bad("dropout_rng has dtype " + dtype_name(t) + "; supported: int64 or uint64 [seed, offset]");
    if (a.ndim() != 1 || a.shape(0) != 2)
      return bad("dropout_rng has " + std::to_string(a.ndim()) + " dimensions of " +
                 (a.ndim() > 0 ? std::to_string(a.shape(0)) : std::string("0")) +
                 " entries; supported: 1 dimension of 2 entries [seed, offset]");
    if (a.stride(0) != 1)
      return bad("dropout_rng has stride " + std::to_string(a.stride(0)) + "; supported: 1 (contiguous)");
    const auto* words = static_cast<const std::uint64_t*>(a.data());
    args->options.dropout.seed_ptr = words;
    args->options.dropout.offset_ptr = words + 1;
  }
  return Status::Ok();
}

Status build_forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& o,
                     const std::optional<OutArray>& lse, const CallOptions& c, ForwardArgs* args) {
  Placement p;
  if (Status s = to_view("q", q, &p, &args->q); !s.ok()) return s;
  if (Status s = to_view("k", k, &p, &args->k); !s.ok()) return s;
  if (Status s = to_view("v", v, &p, &args->v); !s.ok()) return s;
  if (Status s = to_view("out", o, &p, &args->o); !s.ok()) return s;
  if (lse)
    if (Status s = to_lse("lse", *lse, &p, &args->lse); !s.ok()) return s;
  if (Status s = fill_inputs(c.features, &p, args); !s.ok()) return s;
  const FeatureOptions& f = c.features;
  if (f.dbias || f.d_sinks)
    return bad(std::string(f.dbias ? "dbias" : "d_sinks") + " is given to a forward call; supported: backward only");
  if (f.max_logit)
    if (Status s = to_head("max_logit", *f.max_logit, &p, &args->max_logit); !s.ok()) return s;
  args->memory = memory_of(p);
  return fill_common(c, &p, args);
}

Status build_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o, const InArray& d_o,
                      const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv,
                      const CallOptions& c, BackwardArgs* args) {
  Placement p;
  if (Status s = to_view("q", q, &p, &args->q); !s.ok()) return s;
  if (Status s = to_view("k", k, &p, &args->k); !s.ok()) return s;
  if (Status s = to_view("v", v, &p, &args->v); !s.ok()) return s;
  if (Status s = to_view("out", o, &p, &args->o); !s.ok()) return s;
  if (Status s = to_view("dout", d_o, &p, &args->d_o); !s.ok()) return s;
  if (Status s = to_lse("lse", lse, &p, &args->lse); !s.ok()) return s;
  if (Status s = to_view("dq", dq, &p, &args->dq); !s.ok()) return s;
  if (Status s = to_view("dk", dk, &p, &args->dk); !s.ok()) return s;
  if (Status s = to_view("dv", dv, &p, &args->dv); !s.ok()) return s;
  if (Status s = fill_inputs(c.features, &p, args); !s.ok()) return s;
  const FeatureOptions& f = c.features;
  if (f.max_logit) return bad("max_logit is given to a backward call; supported: forward only");
  if (f.dbias)
    if (Status s = to_bias("dbias", *f.dbias, &p, &args->dbias); !s.ok()) return s;
  if (f.d_sinks)
    if (Status s = to_head("d_sinks", *f.d_sinks, &p, &args->d_sinks); !s.ok()) return s;
  args->memory = memory_of(p);
  return fill_common(c, &p, args);
}

// Binding signatures: tensors first, then the shared options as keyword arguments (the
// parameter list, the argument names with their defaults, and the parameters as values).
#define STRIDEATTN_OPTION_PARAMS                                                                              \
  std::string mask, std::int64_t wl, std::int64_t wr, std::optional<double> scale, bool det,                  \
      std::vector<std::int64_t> sq, std::vector<std::int64_t> skv, std::vector<std::int64_t> oq,              \
      std::vector<std::int64_t> okv, std::string backend, std::uintptr_t stream, std::optional<OutArray> ws,  \
      std::optional<InArray> cu_q, std::optional<InArray> cu_kv, std::optional<InArray> off_q,                \
      std::optional<InArray> off_kv, std::int64_t max_q, std::int64_t max_kv, double softcap, double drop_p,  \
      std::uint64_t drop_seed, std::uint64_t drop_offset, std::string bias_type, std::optional<InArray> bias, \
      std::optional<InArray> alibi, std::optional<InArray> sinks, std::optional<OutArray> max_logit,          \
      std::optional<OutArray> dbias, std::optional<OutArray> d_sinks, std::optional<InArray> drop_rng
#define STRIDEATTN_OPTION_VALUES                                                                          \
  std::move(mask), wl, wr, scale, det, std::move(sq), std::move(skv), std::move(oq), std::move(okv),      \
      std::move(backend), stream, std::move(ws), std::move(cu_q), std::move(cu_kv), std::move(off_q),     \
      std::move(off_kv), max_q, max_kv, FeatureOptions {                                                  \
    softcap, drop_p, drop_seed, drop_offset, std::move(bias_type), std::move(bias), std::move(alibi),     \
        std::move(sinks), std::move(max_logit), std::move(dbias), std::move(d_sinks), std::move(drop_rng) \
  }
#define STRIDEATTN_OPTION_ARGS                                                                                        \
  nb::arg("mask") = "none", nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("scale") = nb::none(), \
  nb::arg("deterministic") = false, nb::arg("seqlens_q") = std::vector<std::int64_t>{},                               \
  nb::arg("seqlens_kv") = std::vector<std::int64_t>{}, nb::arg("offsets_q") = std::vector<std::int64_t>{},            \
  nb::arg("offsets_kv") = std::vector<std::int64_t>{}, nb::arg("backend") = "auto", nb::arg("stream") = 0,            \
  nb::arg("workspace").none() = nb::none(), nb::arg("cu_seqlens_q").none() = nb::none(),                              \
  nb::arg("cu_seqlens_kv").none() = nb::none(), nb::arg("seq_offsets_q").none() = nb::none(),                         \
  nb::arg("seq_offsets_kv").none() = nb::none(), nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_kv") = 0,           \
  nb::arg("softcap") = 0.0, nb::arg("dropout_p") = 0.0, nb::arg("dropout_seed") = 0, nb::arg("dropout_offset") = 0,   \
  nb::arg("bias_type") = "none", nb::arg("bias").none() = nb::none(), nb::arg("alibi_slopes").none() = nb::none(),    \
  nb::arg("sinks").none() = nb::none(), nb::arg("max_logit").none() = nb::none(),                                     \
  nb::arg("dbias").none() = nb::none(), nb::arg("d_sinks").none() = nb::none(),                                       \
  nb::arg("dropout_rng").none() = nb::none()

CallOptions call_options(std::string mask, std::int64_t wl, std::int64_t wr, std::optional<double> scale, bool det,
                         std::vector<std::int64_t> sq, std::vector<std::int64_t> skv, std::vector<std::int64_t> oq,
                         std::vector<std::int64_t> okv, std::string backend, std::uintptr_t stream,
                         std::optional<OutArray> ws, std::optional<InArray> cu_q, std::optional<InArray> cu_kv,
                         std::optional<InArray> off_q, std::optional<InArray> off_kv, std::int64_t max_q,
                         std::int64_t max_kv, FeatureOptions features) {
  CallOptions c;
  c.mask = std::move(mask);
  c.window_left = wl;
  c.window_right = wr;
  c.scale = scale;
  c.deterministic = det;
  c.seqlens_q = std::move(sq);
  c.seqlens_kv = std::move(skv);
  c.offsets_q = std::move(oq);
  c.offsets_kv = std::move(okv);
  c.backend = std::move(backend);
  c.stream = stream;
  c.workspace = std::move(ws);
  c.cu_seqlens_q = std::move(cu_q);
  c.cu_seqlens_kv = std::move(cu_kv);
  c.seq_offsets_q = std::move(off_q);
  c.seq_offsets_kv = std::move(off_kv);
  c.max_seqlen_q = max_q;
  c.max_seqlen_kv = max_kv;
  c.features = std::move(features);
  return c;
}

// The extension's plans: every call finds (or makes) the plan of its problem here, keyed by
// everything but the pointers, and runs it with the call's pointers. Never destroyed (a plan's
// cuDNN graph must not be torn down after the CUDA runtime at exit).
constexpr std::size_t kPlanCacheCapacity = 128;
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache(kPlanCacheCapacity);
  return *cache;
}

// A plan as a Python object: made once from tensors (their dtype, shapes, strides, device
// and pointer alignment; nothing else of them is kept), run with integer addresses. `host`
// and `flops` decide, as for forward() and backward(), whether a run waits interruptibly.
struct PyPlan {
  bool backward = false;
  bool host = false;
  double flops = 0.0;
  ForwardPlan fwd;
  BackwardPlan bwd;
  [[nodiscard]] const PlanInfo& info() const {
    return backward ? static_cast<const PlanInfo&>(bwd) : static_cast<const PlanInfo&>(fwd);
  }
};

template <class Args>
void describe_call(const Args& args, PyPlan* plan) {
  plan->host = args.memory == Memory::host;
  plan->flops = rough_flops(args);
}

// The run of a call's own pointers (what PlanCache::forward and ::backward run).
ForwardRun run_of(const ForwardArgs& a) {
  ForwardRun r;
  r.q = a.q.data, r.k = a.k.data, r.v = a.v.data, r.o = a.o.data, r.lse = a.lse.data;
  r.stream = a.stream, r.workspace = a.workspace, r.workspace_bytes = a.workspace_bytes;
  r.cu_seqlens_q = a.varlen.cu_seqlens_q, r.cu_seqlens_kv = a.varlen.cu_seqlens_kv;
  r.seq_offsets_q = a.varlen.seq_offsets_q, r.seq_offsets_kv = a.varlen.seq_offsets_kv;
  r.bias = a.bias.data, r.alibi_slopes = a.alibi_slopes.data, r.sinks = a.sinks.data;
  r.max_logit = a.max_logit.data;
  r.dropout_seed = a.options.dropout.seed, r.dropout_offset = a.options.dropout.offset;
  r.dropout_seed_ptr = a.options.dropout.seed_ptr, r.dropout_offset_ptr = a.options.dropout.offset_ptr;
  return r;
}

BackwardRun run_of(const BackwardArgs& a) {
  BackwardRun r;
  r.q = a.q.data, r.k = a.k.data, r.v = a.v.data, r.o = a.o.data, r.d_o = a.d_o.data, r.lse = a.lse.data;
  r.dq = a.dq.data, r.dk = a.dk.data, r.dv = a.dv.data;
  r.stream = a.stream, r.workspace = a.workspace, r.workspace_bytes = a.workspace_bytes;
  r.cu_seqlens_q = a.varlen.cu_seqlens_q, r.cu_seqlens_kv = a.varlen.cu_seqlens_kv;
  r.seq_offsets_q = a.varlen.seq_offsets_q, r.seq_offsets_kv = a.varlen.seq_offsets_kv;
  r.bias = a.bias.data, r.alibi_slopes = a.alibi_slopes.data, r.sinks = a.sinks.data;
  r.dbias = a.dbias.data, r.d_sinks = a.d_sinks.data;
  r.dropout_seed = a.options.dropout.seed, r.dropout_offset = a.options.dropout.offset;
  r.dropout_seed_ptr = a.options.dropout.seed_ptr, r.dropout_offset_ptr = a.options.dropout.offset_ptr;
  return r;
}

// A plan's run, interruptible where forward() and backward() are.
template <class Plan, class Run>
Status run_plan_interruptible(const PyPlan& p, const Plan& plan, Run run) {
  return run_interruptible_call(p.host, p.flops, [&plan, &run](const std::atomic<bool>* cancel) {
    if (cancel) run.cancel = cancel;
    return plan.run(run);
  });
}

using PlannedResult = std::tuple<std::string, std::string, std::optional<PyPlan>>;

// forward() / backward() that also hand back the plan they ran (from the extension's cache),
// so that a framework layer can run it again with integer addresses: the same checks, the
// same errors, the same single plan per problem. No plan comes back when the call failed.
PlannedResult planned_result(const Status& s, PyPlan&& plan) {
  if (!s.ok()) return {std::string(to_string(s.code())), s.message(), std::nullopt};
  return {"ok", "", std::move(plan)};
}

PlannedResult run_planned(const ForwardArgs& args) {
  PyPlan plan;
  describe_call(args, &plan);
  Status s = plan_cache().get(args, &plan.fwd);
  if (s.ok()) s = run_plan_interruptible(plan, plan.fwd, run_of(args));
  return planned_result(s, std::move(plan));
}

PlannedResult run_planned(const BackwardArgs& args) {
  PyPlan plan;
  plan.backward = true;
  describe_call(args, &plan);
  Status s = plan_cache().get(args, &plan.bwd);
  if (s.ok()) s = run_plan_interruptible(plan, plan.bwd, run_of(args));
  return planned_result(s, std::move(plan));
}

// Logging bridge: the library's sink calls the Python forwarder (strideattn/_log.py), taking
// the GIL, from whichever thread logs: a call made with the GIL released or a thread Python
// never saw. The forwarder's reference is kept for the life of the process, so a thread
// that read the pointer just before a swap still calls a live object.
std::atomic<PyObject*> g_log_forwarder{nullptr};

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

void python_log_sink(LogLevel level, std::string_view message, void*) {
  PyObject* forwarder = g_log_forwarder.load();
  if (!forwarder || !Py_IsInitialized() || python_finalizing()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  // A caller's pending exception survives the record.
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* pending = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
#endif
  PyObject* py_level = PyLong_FromLong(static_cast<long>(level));
  PyObject* py_message =  // an environment value in the text need not be UTF-8
      PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
  PyObject* r =
      py_level && py_message ? PyObject_CallFunctionObjArgs(forwarder, py_level, py_message, nullptr) : nullptr;
  if (r)
    Py_DECREF(r);
  else
    PyErr_WriteUnraisable(forwarder);
  Py_XDECREF(py_level);
  Py_XDECREF(py_message);
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(pending);
#else
  PyErr_Restore(type, value, trace);
#endif
  PyGILState_Release(gil);
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "strideattn C++ bindings (use the strideattn package, not this module)";
  bind_kvcache(m);

  m.def("version", [] { return std::string(version()); });

  m.def("set_log_level", [](const std::string& name) {
    const std::optional<LogLevel> level = log_level_from_string(name);
    if (!level)
      throw nb::value_error(("log level '" + name +
                             "' is unknown; accepted (any case): off, error, warn, info, debug, "
                             "warning, verbose, 0, 1, 2, true, false, yes, no, on, none")
                                .c_str());
    set_log_level(*level);
  });
  m.def("log_level", [] { return std::string(to_string(log_level())); });
  m.def("flush_log", [] { flush_log(); });
  m.def(
      "_set_log_forwarder",
      [](nb::object forwarder) {
        if (forwarder.is_none()) {
          set_log_sink(nullptr);  // pending counts reach the forwarder first
          g_log_forwarder.store(nullptr);
          return;
        }
        PyObject* keep = forwarder.release().ptr();  // owned for the rest of the process
        g_log_forwarder.store(keep);
        set_log_sink(&python_log_sink);
      },
      nb::arg("forwarder").none());

  m.def("compiled_backends", [] {
    std::vector<std::string> names;
    for (Backend b : kConcreteBackends)
      if (backend_compiled(b)) names.emplace_back(to_string(b));
    return names;
  });

  m.def(
      "forward",
      [](InArray q, InArray k, InArray v, OutArray o, std::optional<OutArray> lse, STRIDEATTN_OPTION_PARAMS) -> Result {
        ForwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        if (Status s = build_forward(q, k, v, o, lse, c, &args); !s.ok()) return result(s);
        return result(
            run_interruptible(args, rough_flops(args), [](const ForwardArgs& a) { return plan_cache().forward(a); }));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), STRIDEATTN_OPTION_ARGS);

  m.def(
      "backward",
      [](InArray q, InArray k, InArray v, InArray o, InArray d_o, InArray lse, OutArray dq, OutArray dk, OutArray dv,
         STRIDEATTN_OPTION_PARAMS) -> Result {
        BackwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        if (Status s = build_backward(q, k, v, o, d_o, lse, dq, dk, dv, c, &args); !s.ok()) return result(s);
        return result(
            run_interruptible(args, rough_flops(args), [](const BackwardArgs& a) { return plan_cache().backward(a); }));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), STRIDEATTN_OPTION_ARGS);

  // forward() and backward() that hand back the plan they ran (None when the call failed):
  // the PyTorch layer keeps it per problem and runs it again with integer addresses.
  m.def(
      "forward_planned",
      [](InArray q, InArray k, InArray v, OutArray o, std::optional<OutArray> lse,
         STRIDEATTN_OPTION_PARAMS) -> PlannedResult {
        ForwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        if (Status s = build_forward(q, k, v, o, lse, c, &args); !s.ok()) return planned_result(s, PyPlan{});
        return run_planned(args);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), STRIDEATTN_OPTION_ARGS);

  m.def(
      "backward_planned",
      [](InArray q, InArray k, InArray v, InArray o, InArray d_o, InArray lse, OutArray dq, OutArray dk, OutArray dv,
         STRIDEATTN_OPTION_PARAMS) -> PlannedResult {
        BackwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        if (Status s = build_backward(q, k, v, o, d_o, lse, dq, dk, dv, c, &args); !s.ok())
          return planned_result(s, PyPlan{});
        return run_planned(args);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), STRIDEATTN_OPTION_ARGS);

  // The workspace a call with these arguments needs (bytes), from the same plans: allocate it
  // in the framework (PyTorch's caching allocator) and pass it as workspace=.
  m.def(
      "workspace_size_forward",
      [](InArray q, InArray k, InArray v, OutArray o, std::optional<OutArray> lse,
         STRIDEATTN_OPTION_PARAMS) -> std::tuple<std::string, std::string, std::size_t> {
        ForwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        ForwardPlan plan;
        Status s = build_forward(q, k, v, o, lse, c, &args);
        if (s.ok()) s = plan_cache().get(args, &plan);
        return {std::string(to_string(s.code())), s.message(), s.ok() ? plan.workspace_size() : 0};
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), STRIDEATTN_OPTION_ARGS);

  m.def(
      "workspace_size_backward",
      [](InArray q, InArray k, InArray v, InArray o, InArray d_o, InArray lse, OutArray dq, OutArray dk, OutArray dv,
         STRIDEATTN_OPTION_PARAMS) -> std::tuple<std::string, std::string, std::size_t> {
        BackwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        BackwardPlan plan;
        Status s = build_backward(q, k, v, o, d_o, lse, dq, dk, dv, c, &args);
        if (s.ok()) s = plan_cache().get(args, &plan);
        return {std::string(to_string(s.code())), s.message(), s.ok() ? plan.workspace_size() : 0};
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), STRIDEATTN_OPTION_ARGS);

  m.def("plan_cache_info", [] {
    const PlanCache::Stats st = plan_cache().stats();
    nb::dict d;
    d["size"] = st.size;
    d["capacity"] = st.capacity;
    d["hits"] = st.hits;
    d["misses"] = st.misses;
    return d;
  });
  m.def("clear_plan_cache", [] { plan_cache().clear(); });

  // Plans as objects: made from tensors once (their dtype, shapes, strides, device and the
  // alignment of their addresses: a run's addresses must be as aligned), run with integer
  // addresses (tensor.data_ptr()); no DLPack import and no option parsing per run.
  nb::class_<PyPlan>(m, "Plan")
      .def_prop_ro("backward", [](const PyPlan& p) { return p.backward; })
      .def_prop_ro("backend", [](const PyPlan& p) { return std::string(to_string(p.info().backend())); })
      .def_prop_ro("workspace_size", [](const PyPlan& p) { return p.info().workspace_size(); })
      .def_prop_ro("reason", [](const PyPlan& p) { return p.info().reason(); })
      .def_prop_ro("writes_lse", [](const PyPlan& p) { return p.info().writes_lse(); })
      .def(
          "run_forward",
          [](const PyPlan& p, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
             std::uintptr_t lse, std::uintptr_t stream, std::uintptr_t ws, std::size_t ws_bytes, std::uintptr_t cu_q,
             std::uintptr_t cu_kv, std::uintptr_t off_q, std::uintptr_t off_kv) -> Result {
            if (p.backward) return result(bad("run_forward on a backward plan; use run_backward"));
            ForwardRun r;
            r.q = reinterpret_cast<const void*>(q), r.k = reinterpret_cast<const void*>(k);
            r.v = reinterpret_cast<const void*>(v), r.o = reinterpret_cast<void*>(o);
            r.lse = reinterpret_cast<float*>(lse);
            r.stream = reinterpret_cast<void*>(stream);
            r.workspace = reinterpret_cast<void*>(ws), r.workspace_bytes = ws_bytes;
            r.cu_seqlens_q = reinterpret_cast<const std::int32_t*>(cu_q);
            r.cu_seqlens_kv = reinterpret_cast<const std::int32_t*>(cu_kv);
            r.seq_offsets_q = reinterpret_cast<const std::int32_t*>(off_q);
            r.seq_offsets_kv = reinterpret_cast<const std::int32_t*>(off_kv);
            return result(run_plan_interruptible(p, p.fwd, r));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse") = 0, nb::arg("stream") = 0,
          nb::arg("workspace") = 0, nb::arg("workspace_bytes") = 0, nb::arg("cu_seqlens_q") = 0,
          nb::arg("cu_seqlens_kv") = 0, nb::arg("seq_offsets_q") = 0, nb::arg("seq_offsets_kv") = 0)
      .def(
          "run_backward",
          [](const PyPlan& p, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
             std::uintptr_t d_o, std::uintptr_t lse, std::uintptr_t dq, std::uintptr_t dk, std::uintptr_t dv,
             std::uintptr_t stream, std::uintptr_t ws, std::size_t ws_bytes, std::uintptr_t cu_q, std::uintptr_t cu_kv,
             std::uintptr_t off_q, std::uintptr_t off_kv) -> Result {
            if (!p.backward) return result(bad("run_backward on a forward plan; use run_forward"));
            BackwardRun r;
            r.q = reinterpret_cast<const void*>(q), r.k = reinterpret_cast<const void*>(k);
            r.v = reinterpret_cast<const void*>(v), r.o = reinterpret_cast<const void*>(o);
            r.d_o = reinterpret_cast<const void*>(d_o), r.lse = reinterpret_cast<const float*>(lse);
            r.dq = reinterpret_cast<void*>(dq), r.dk = reinterpret_cast<void*>(dk), r.dv = reinterpret_cast<void*>(dv);
            r.stream = reinterpret_cast<void*>(stream);
            r.workspace = reinterpret_cast<void*>(ws), r.workspace_bytes = ws_bytes;
            r.cu_seqlens_q = reinterpret_cast<const std::int32_t*>(cu_q);
            r.cu_seqlens_kv = reinterpret_cast<const std::int32_t*>(cu_kv);
            r.seq_offsets_q = reinterpret_cast<const std::int32_t*>(off_q);
            r.seq_offsets_kv = reinterpret_cast<const std::int32_t*>(off_kv);
            return result(run_plan_interruptible(p, p.bwd, r));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"),
          nb::arg("dk"), nb::arg("dv"), nb::arg("stream") = 0, nb::arg("workspace") = 0, nb::arg("workspace_bytes") = 0,
          nb::arg("cu_seqlens_q") = 0, nb::arg("cu_seqlens_kv") = 0, nb::arg("seq_offsets_q") = 0,
          nb::arg("seq_offsets_kv") = 0);

  m.def(
      "make_forward_plan",
      [](InArray q, InArray k, InArray v, OutArray o, std::optional<OutArray> lse,
         STRIDEATTN_OPTION_PARAMS) -> std::tuple<std::string, std::string, std::optional<PyPlan>> {
        ForwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        Status s = build_forward(q, k, v, o, lse, c, &args);
        PyPlan plan;
        describe_call(args, &plan);
        if (s.ok()) s = make_plan(args, &plan.fwd);
        if (!s.ok()) return {std::string(to_string(s.code())), s.message(), std::nullopt};
        return {"ok", "", std::move(plan)};
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), STRIDEATTN_OPTION_ARGS);

  m.def(
      "make_backward_plan",
      [](InArray q, InArray k, InArray v, InArray o, InArray d_o, InArray lse, OutArray dq, OutArray dk, OutArray dv,
         STRIDEATTN_OPTION_PARAMS) -> std::tuple<std::string, std::string, std::optional<PyPlan>> {
        BackwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        Status s = build_backward(q, k, v, o, d_o, lse, dq, dk, dv, c, &args);
        PyPlan plan;
        plan.backward = true;
        describe_call(args, &plan);
        if (s.ok()) s = make_plan(args, &plan.bwd);
        if (!s.ok()) return {std::string(to_string(s.code())), s.message(), std::nullopt};
        return {"ok", "", std::move(plan)};
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), STRIDEATTN_OPTION_ARGS);

  m.def(
      "explain_forward",
      [](InArray q, InArray k, InArray v, OutArray o, std::optional<OutArray> lse,
         STRIDEATTN_OPTION_PARAMS) -> nb::dict {
        ForwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        Explanation ex;
        if (Status s = build_forward(q, k, v, o, lse, c, &args); !s.ok()) {
          ex.validation = s;
          return explanation_dict(ex);
        }
        nb::dict d = explanation_dict(strideattn::explain(args));
        ForwardPlan plan;  // the workspace a call would need (0 where it cannot run)
        d["workspace_size"] = plan_cache().get(args, &plan).ok() ? plan.workspace_size() : 0;
        return d;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), STRIDEATTN_OPTION_ARGS);

  m.def(
      "explain_backward",
      [](InArray q, InArray k, InArray v, InArray o, InArray d_o, InArray lse, OutArray dq, OutArray dk, OutArray dv,
         STRIDEATTN_OPTION_PARAMS) -> nb::dict {
        BackwardArgs args;
        const CallOptions c = call_options(STRIDEATTN_OPTION_VALUES);
        Explanation ex;
        if (Status s = build_backward(q, k, v, o, d_o, lse, dq, dk, dv, c, &args); !s.ok()) {
          ex.validation = s;
          return explanation_dict(ex);
        }
        nb::dict d = explanation_dict(strideattn::explain(args));
        BackwardPlan plan;
        d["workspace_size"] = plan_cache().get(args, &plan).ok() ? plan.workspace_size() : 0;
        return d;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), STRIDEATTN_OPTION_ARGS);
}
