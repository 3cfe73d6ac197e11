// Helpers shared by the translation units of strideattn._ext (ext.cpp, ext_kvcache.cpp): the
// array types, placing every tensor of a call on one device, reading a DLPack array as a
// TensorView / LseView / BiasView / HeadView (pointer plus its own element strides), parsing
// the mask, backend and training-feature options, the explanation as a dict, and running a
// call interruptibly with the GIL released.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "strideattn/strideattn.hpp"

namespace strideattn::pyext {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;                  // inputs: any dtype/device/strides; read-only is fine
using OutArray = nb::ndarray<>;                       // outputs: must be writable
using Result = std::tuple<std::string, std::string>;  // (status code name, message)

// DLPack device types (dlpack.h): kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3, kDLCUDAManaged 13.
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

struct Placement {
  bool set = false;
  int device_type = 0;
  int device_id = 0;
  std::string first;  // name of the tensor that fixed the placement
};

inline std::string device_name(int type, int id) {
  switch (type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda:" + std::to_string(id);
    case kDLCUDAHost:
      return "cuda_host (pinned)";
    case kDLCUDAManaged:
      return "cuda_managed:" + std::to_string(id);
    default:
      return "DLPack device type " + std::to_string(type);
  }
}

inline std::string dtype_name(nb::dlpack::dtype t) {
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  std::string base = code == nb::dlpack::dtype_code::Float     ? "float"
                     : code == nb::dlpack::dtype_code::Bfloat  ? "bfloat"
                     : code == nb::dlpack::dtype_code::Int     ? "int"
                     : code == nb::dlpack::dtype_code::UInt    ? "uint"
                     : code == nb::dlpack::dtype_code::Bool    ? "bool"
                     : code == nb::dlpack::dtype_code::Complex ? "complex"
                                                               : "code" + std::to_string(t.code) + "_";
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

inline Status bad(std::string msg) { return Status(StatusCode::invalid_argument, std::move(msg)); }

inline Result result(const Status& s) { return {std::string(to_string(s.code())), s.message()}; }

// Every tensor of one call must live on one device; the first one fixes it.
template <class Array>
Status place(const char* name, const Array& a, Placement* p) {
  const int type = a.device_type(), id = a.device_id();
  if (type != kDLCPU && type != kDLCUDA && type != kDLCUDAHost && type != kDLCUDAManaged)
    return bad(std::string(name) + " is on " + device_name(type, id) +
               "; supported: cpu, cuda (device, pinned host or managed memory)");
  if (!p->set) {
    *p = {true, type, id, name};
    return Status::Ok();
  }
  const bool host_a = type == kDLCPU || type == kDLCUDAHost;
  const bool host_p = p->device_type == kDLCPU || p->device_type == kDLCUDAHost;
  if (host_a != host_p || (!host_a && id != p->device_id))
    return bad(std::string(name) + " is on " + device_name(type, id) + " but " + p->first + " is on " +
               device_name(p->device_type, p->device_id) + "; all tensors of a call must be on one device");
  return Status::Ok();
}

inline Memory memory_of(const Placement& p) {
  return (p.device_type == kDLCUDA || p.device_type == kDLCUDAManaged) ? Memory::device : Memory::host;
}

// Copies the array's ndim() dims into the last ndim() of N. Where the array has one dim
// fewer (varlen), the inserted leading dim has extent 1 and the span of the tensor as stride,
// so that it never looks like an aliased (zero-stride) dimension. Callers check ndim().
template <class Array, std::size_t N>
void read_dims(const Array& a, std::array<std::int64_t, N>* shape, std::array<std::int64_t, N>* stride) {
  const std::size_t nd = a.ndim();
  const std::size_t lead = N - nd;
  for (std::size_t i = 0; i < nd; ++i) {
    (*shape)[lead + i] = static_cast<std::int64_t>(a.shape(i));
    (*stride)[lead + i] = a.stride(i);
  }
  if (lead == 1) {
    std::int64_t span = 1;
    for (std::size_t i = 1; i < N; ++i)
      if ((*shape)[i] > 0) span += ((*shape)[i] - 1) * std::llabs((*stride)[i]);
    (*shape)[0] = 1;
    (*stride)[0] = span;
  }
}

// The element type of a tensor or bias array: float16, bfloat16 or float32.
inline Status element_dtype(const char* name, const nb::dlpack::dtype& t, DType* out) {
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  if (t.lanes == 1 && t.bits == 16 && code == nb::dlpack::dtype_code::Float) {
    *out = DType::f16;
  } else if (t.lanes == 1 && t.bits == 16 && code == nb::dlpack::dtype_code::Bfloat) {
    *out = DType::bf16;
  } else if (t.lanes == 1 && t.bits == 32 && code == nb::dlpack::dtype_code::Float) {
    *out = DType::f32;
  } else {
    return bad(std::string(name) + " has dtype " + dtype_name(t) + "; supported: float16, bfloat16, float32");
  }
  return Status::Ok();
}

// A [b, s, h, d] tensor, or [tokens, h, d] (varlen) read as [1, tokens, h, d].
template <class Array>
Status to_view(const char* name, const Array& a, Placement* p, TensorView* out) {
  if (Status s = place(name, a, p); !s.ok()) return s;
  if (Status s = element_dtype(name, a.dtype(), &out->dtype); !s.ok()) return s;
  const std::size_t nd = a.ndim();
  if (nd != 4 && nd != 3)
    return bad(std::string(name) + " has " + std::to_string(nd) +
               " dimensions; supported: 4 ([batch, seq, heads, head_dim]) or 3 "
               "([tokens, heads, head_dim], varlen)");
  out->data = const_cast<void*>(static_cast<const void*>(a.data()));
  read_dims(a, &out->shape, &out->stride);
  return Status::Ok();
}

// LSE: [b, h, s_q] float32, or [h, tokens] (varlen) read as [1, h, tokens].
template <class Array>
Status to_lse(const char* name, const Array& a, Placement* p, LseView* out) {
  if (Status s = place(name, a, p); !s.ok()) return s;
  const nb::dlpack::dtype t = a.dtype();
  if (!(t.lanes == 1 && t.bits == 32 && static_cast<nb::dlpack::dtype_code>(t.code) == nb::dlpack::dtype_code::Float))
    return bad(std::string(name) + " has dtype " + dtype_name(t) + "; supported: float32");
  const std::size_t nd = a.ndim();
  if (nd != 3 && nd != 2)
    return bad(std::string(name) + " has " + std::to_string(nd) +
               " dimensions; supported: 3 ([batch, heads, seq_q]) or 2 ([heads, tokens], varlen)");
  out->data = static_cast<float*>(const_cast<void*>(static_cast<const void*>(a.data())));
  read_dims(a, &out->shape, &out->stride);
  return Status::Ok();
}

// A bias (or dbias): logical [b or 1, h or 1, s_q or 1, s_kv or 1], any strides, f32/f16/bf16.
template <class Array>
Status to_bias(const char* name, const Array& a, Placement* p, BiasView* out) {
  if (Status s = place(name, a, p); !s.ok()) return s;
  if (Status s = element_dtype(name, a.dtype(), &out->dtype); !s.ok()) return s;
  if (a.ndim() != 4)
    return bad(std::string(name) + " has " + std::to_string(a.ndim()) +
               " dimensions; supported: 4 ([b or 1, h or 1, s_q or 1, s_kv or 1])");
  out->data = const_cast<void*>(static_cast<const void*>(a.data()));
  for (std::size_t i = 0; i < 4; ++i) {
    out->shape[i] = static_cast<std::int64_t>(a.shape(i));
    out->stride[i] = a.stride(i);
  }
  return Status::Ok();
}

// An fp32 head table: [h] (read as one row, [1, h]) or [rows, h], any strides.
template <class Array>
Status to_head(const char* name, const Array& a, Placement* p, HeadView* out) {
  if (Status s = place(name, a, p); !s.ok()) return s;
  const nb::dlpack::dtype t = a.dtype();
  if (!(t.lanes == 1 && t.bits == 32 && static_cast<nb::dlpack::dtype_code>(t.code) == nb::dlpack::dtype_code::Float))
    return bad(std::string(name) + " has dtype " + dtype_name(t) + "; supported: float32");
  const std::size_t nd = a.ndim();
  if (nd != 1 && nd != 2)
    return bad(std::string(name) + " has " + std::to_string(nd) + " dimensions; supported: 1 ([h]) or 2 ([rows, h])");
  out->data = static_cast<float*>(const_cast<void*>(static_cast<const void*>(a.data())));
  out->shape = {nd == 2 ? static_cast<std::int64_t>(a.shape(0)) : 1, static_cast<std::int64_t>(a.shape(nd - 1))};
  out->stride = {nd == 2 ? a.stride(0) : 0, a.stride(nd - 1)};
  return Status::Ok();
}

// The training features of a call (docs/semantics.md "Training features"), as the bindings
// take them: options by value, tensors as arrays (max_logit forward only, dbias / d_sinks
// backward only; the library rejects them elsewhere with a named rule).
struct FeatureOptions {
  double softcap = 0.0;
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  std::string bias_type = "none";
  std::optional<InArray> bias, alibi_slopes, sinks;
  std::optional<OutArray> max_logit, dbias, d_sinks;
  // Dropout's seed and offset read when the call runs: a 1-D tensor of two 64-bit integers
  // [seed, offset] in the tensors' memory (overrides dropout_seed / dropout_offset).
  std::optional<InArray> dropout_rng;
};

inline Status parse_features(const FeatureOptions& f, AttentionOptions* o) {
  o->softcap = f.softcap;
  o->dropout.p = f.dropout_p;
  o->dropout.seed = f.dropout_seed;
  o->dropout.offset = f.dropout_offset;
  const std::optional<BiasType> bt = bias_type_from_string(f.bias_type);
  if (!bt) return bad("bias_type='" + f.bias_type + "' is not a bias type; supported: none, post_scale, pre_scale");
  o->bias_type = *bt;
  return Status::Ok();
}

inline Status parse_options(const std::string& mask, std::int64_t window_left, std::int64_t window_right,
                            std::optional<double> scale, bool deterministic, AttentionOptions* o) {
  if (mask == "none") {
    o->mask = MaskKind::none;
  } else if (mask == "causal") {
    o->mask = MaskKind::causal;
  } else if (mask == "causal-bottom-right" || mask == "causal_bottom_right") {
    o->mask = MaskKind::causal_bottom_right;
  } else {
    return bad("mask='" + mask + "' is not a mask; supported: none, causal, causal-bottom-right");
  }
  o->window = Window{.left = window_left, .right = window_right};
  o->scale = scale;
  o->deterministic = deterministic;
  return Status::Ok();
}

inline Status parse_backend(const std::string& name, Backend* b) {
  auto parsed = backend_from_string(name);
  if (!parsed) return bad("backend='" + name + "' is not a backend; supported: auto, reference, cpu, cuda, cudnn");
  *b = *parsed;
  return Status::Ok();
}

inline nb::dict explanation_dict(const Explanation& ex) {
  nb::dict d;
  d["valid"] = ex.validation.ok();
  d["code"] = std::string(to_string(ex.validation.code()));
  d["error"] = ex.validation.ok() ? nb::none() : nb::cast(ex.validation.message());
  d["layout"] = ex.layout;
  nb::list verdicts;
  for (const Verdict& v : ex.verdicts) {
    nb::dict e;
    e["backend"] = std::string(to_string(v.backend));
    e["supported"] = v.supported;
    e["rule"] = v.rule;
    e["reason"] = v.reason;
    verdicts.append(e);
  }
  d["verdicts"] = verdicts;
  d["chosen"] = ex.chosen ? nb::cast(std::string(to_string(*ex.chosen))) : nb::none();
  return d;
}

// Runs call(cancel) (a plan's run, strideattn::forward, backward or forward_with_kvcache) with
// the GIL released; `cancel` is the flag the call hands the library (null: none). A
// host-memory call long enough to matter runs on a helper thread while this thread waits in
// 20 ms slices and checks for signals (Python runs its handlers only on the main thread,
// between bytecodes, so a call made in place would ignore Ctrl-C until it returned). On a
// pending KeyboardInterrupt (or any handler that raised) the call's cancel flag is set, the
// call is waited for (host backends stop within milliseconds), and the Python error is raised.
// `flops` is the caller's rough estimate: below ~1e7 (well under a millisecond) run in place.
template <class Call>
Status run_interruptible_call(bool host, double flops, Call call) {
  if (!host || flops < 1e7) {
    nb::gil_scoped_release release;
    return call(nullptr);
  }
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    std::atomic<bool> cancel{false};
  };
  auto shared = std::make_shared<Shared>();
  std::thread worker;
  try {
    worker = std::thread([shared, &call] {
      Status st = call(&shared->cancel);
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->status = std::move(st);
      shared->done = true;
      shared->cv.notify_all();
    });
  } catch (const std::system_error&) {
    nb::gil_scoped_release release;  // no thread to spare: run in place, uninterruptible
    return call(nullptr);
  }
  bool interrupted = false;
  for (;;) {
    bool done;
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(shared->mu);
      done = shared->cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return shared->done; });
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) {
      interrupted = true;
      shared->cancel = true;
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(shared->mu);
      shared->cv.wait(lock, [&] { return shared->done; });
      break;
    }
  }
  worker.join();
  if (interrupted) throw nb::python_error();  // the pending KeyboardInterrupt
  return shared->status;
}

// run_interruptible_call for a call of arguments (ForwardArgs, BackwardArgs, KvCacheArgs):
// the cancel flag goes into args.options.
template <class Args, class Call>
Status run_interruptible(Args& args, double flops, Call call) {
  return run_interruptible_call(args.memory == Memory::host, flops, [&args, &call](const std::atomic<bool>* cancel) {
    if (cancel) args.options.cancel = cancel;
    return call(args);
  });
}

// Rough FLOPs of a forward or backward call, from its views.
template <class Args>
double rough_flops(const Args& a) {
  return 2.0 * double(a.q.shape[0]) * double(a.q.shape[1]) * double(a.q.shape[2]) * double(a.k.shape[1]) *
         double(a.q.shape[3] + a.v.shape[3]);
}

// Registers forward_kvcache and explain_kvcache (ext_kvcache.cpp).
void bind_kvcache(nb::module_& m);

}  // namespace strideattn::pyext
