// bench_dispatch: the host time of one call, the cost the library adds before a kernel runs. For a
// tiny problem ([1, 128, 4, 64] bf16 by default, the size at which attention is host-bound) it
// times, per backend:
//   fake       a backend that does no work, installed in place of `cpu` through the test hook
//              ScopedBackendOverride: what validation, selection and dispatch cost alone;
//   reference, cpu   the host backends (their compute included);
//   cuda, cudnn      with a GPU: the time to enqueue (the stream is drained between batches,
//                    outside the timed region).
// Each backend is timed through the per-call functions (forward/backward), on contiguous views
// and on the split views of one fused QKV buffer with the gradients in one fused buffer too
// (whose byte ranges interleave, so the overlap rules have real work), and through plans: one
// made once and run with the case's pointers (plan_run), and the making itself (plan_make).
// Times are the median
// over batches of the mean per call, in microseconds. `--json PATH` writes a data file (the
// format of bench/results/dispatch/*.json, bench/README.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/backend.hpp"
#include "dispatch/registry.hpp"
#include "strideattn/strideattn.hpp"

#if defined(STRIDEATTN_BENCH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace strideattn;

// ------------------------------------------------------------------ the no-work backend

class FakeBackend final : public detail::BackendImpl {
 public:
  [[nodiscard]] Backend id() const override { return Backend::cpu; }
  [[nodiscard]] Verdict supports(const detail::Problem&) const override {
    Verdict v;
    v.backend = Backend::cpu;
    v.supported = true;
    return v;
  }
  [[nodiscard]] Status forward(const detail::Problem&) override { return Status::Ok(); }
  [[nodiscard]] Status backward(const detail::Problem&) override { return Status::Ok(); }
};

// ------------------------------------------------------------------ buffers

struct Sizes {
  std::int64_t b = 1, s = 128, h = 4, hg = 4, d = 64;
};

// One allocation, host or device, 256-byte aligned.
class Buffer {
 public:
  Buffer(std::size_t bytes, bool device) : device_(device) {
#if defined(STRIDEATTN_BENCH_CUDA)
    if (device) {
      if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
      if (ptr_) cudaMemset(ptr_, 0, bytes);
      return;
    }
#endif
    ptr_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (ptr_) std::memset(ptr_, 0, bytes);
  }
  ~Buffer() {
#if defined(STRIDEATTN_BENCH_CUDA)
    if (device_) {
      cudaFree(ptr_);
      return;
    }
#endif
    std::free(ptr_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  [[nodiscard]] void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  bool device_ = false;
};

// Forward and backward arguments of one case on its own buffers.
struct Case {
  std::string layout;  // "bshd" (one buffer per tensor) or "fused" (split views of one buffer)
  std::vector<std::unique_ptr<Buffer>> buffers;
  ForwardArgs fwd;
  BackwardArgs bwd;
  std::unique_ptr<Buffer> workspace;
};

TensorView view(void* base, std::int64_t offset, Dims4 shape, Dims4 stride) {
  TensorView t;
  t.data = static_cast<std::uint16_t*>(base) + offset;
  t.dtype = DType::bf16;
  t.shape = shape;
  t.stride = stride;
  return t;
}

Case make_case(const Sizes& z, const std::string& layout, Memory memory, Backend backend) {
  Case c;
  c.layout = layout;
  const bool dev = memory == Memory::device;
  auto alloc = [&](std::size_t elems) {
    c.buffers.push_back(std::make_unique<Buffer>(elems * 2, dev));
    return c.buffers.back()->get();
  };
  const Dims4 q_shape{z.b, z.s, z.h, z.d}, kv_shape{z.b, z.s, z.hg, z.d};
  const std::size_t q_elems = std::size_t(z.b * z.s * z.h * z.d), kv_elems = std::size_t(z.b * z.s * z.hg * z.d);
  TensorView q, k, v, o, d_o, dq, dk, dv;
  if (layout == "fused") {
    // [s, b, h + 2 hg, d] for q/k/v and for dq/dk/dv; o and dO contiguous bshd.
    const std::int64_t row = (z.h + 2 * z.hg) * z.d;
    const Dims4 st{row, z.b * row, z.d, 1};
    void* qkv = alloc(std::size_t(z.s * z.b * row));
    void* grad = alloc(std::size_t(z.s * z.b * row));
    q = view(qkv, 0, q_shape, st), k = view(qkv, z.h * z.d, kv_shape, st);
    v = view(qkv, (z.h + z.hg) * z.d, kv_shape, st);
    dq = view(grad, 0, q_shape, st), dk = view(grad, z.h * z.d, kv_shape, st);
    dv = view(grad, (z.h + z.hg) * z.d, kv_shape, st);
  } else {
    const Dims4 qs{z.s * z.h * z.d, z.h * z.d, z.d, 1}, ks{z.s * z.hg * z.d, z.hg * z.d, z.d, 1};
    q = view(alloc(q_elems), 0, q_shape, qs), k = view(alloc(kv_elems), 0, kv_shape, ks);
    v = view(alloc(kv_elems), 0, kv_shape, ks);
    dq = view(alloc(q_elems), 0, q_shape, qs), dk = view(alloc(kv_elems), 0, kv_shape, ks);
    dv = view(alloc(kv_elems), 0, kv_shape, ks);
  }
  const Dims4 os{z.s * z.h * z.d, z.h * z.d, z.d, 1};
  o = view(alloc(q_elems), 0, q_shape, os), d_o = view(alloc(q_elems), 0, q_shape, os);
  c.buffers.push_back(std::make_unique<Buffer>(std::size_t(z.b * z.h * z.s) * 4, dev));
  LseView lse{static_cast<float*>(c.buffers.back()->get()), {z.b, z.h, z.s}, {z.h * z.s, z.s, 1}};
  c.fwd.q = q, c.fwd.k = k, c.fwd.v = v, c.fwd.o = o, c.fwd.lse = lse;
  c.fwd.options.mask = MaskKind::causal;
  c.fwd.backend = backend;
  c.fwd.memory = memory;
  c.bwd.q = q, c.bwd.k = k, c.bwd.v = v, c.bwd.o = o, c.bwd.d_o = d_o, c.bwd.lse = lse;
  c.bwd.dq = dq, c.bwd.dk = dk, c.bwd.dv = dv;
  c.bwd.options = c.fwd.options;
  c.bwd.backend = backend;
  c.bwd.memory = memory;
  return c;
}

// Gives the case a workspace as large as either direction needs (GPU backends), so the run
// does not allocate.
bool attach_workspace(Case* c) {
  std::size_t f = 0, b = 0;
  if (!workspace_size(c->fwd, &f).ok() || !workspace_size(c->bwd, &b).ok()) return false;
  const std::size_t bytes = std::max(f, b);
  if (bytes == 0) return true;
  c->workspace = std::make_unique<Buffer>(bytes, c->fwd.memory == Memory::device);
  c->fwd.workspace = c->bwd.workspace = c->workspace->get();
  c->fwd.workspace_bytes = c->bwd.workspace_bytes = bytes;
  return true;
}

// ------------------------------------------------------------------ timing

double now_us() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::micro>(clock::now().time_since_epoch()).count();
}

void drain(bool device) {
#if defined(STRIDEATTN_BENCH_CUDA)
  if (device) cudaDeviceSynchronize();
#else
  (void)device;
#endif
}

struct Timing {
  double us = -1;  // median over batches of the mean time per call
  int calls = 0;   // calls per batch
  std::string error;
};

// `call` returns false on failure (then `error` says why).
Timing time_calls(const std::function<Status()>& call, bool device, int batches, double budget_us) {
  Timing t;
  for (int i = 0; i < 20; ++i) {  // warm-up: plans, graphs, first-touch
    Status s = call();
    if (!s.ok()) {
      t.error = s.message();
      return t;
    }
  }
  drain(device);
  // Calls per batch: about budget_us per batch, at least 10.
  const double t0 = now_us();
  for (int i = 0; i < 10; ++i) (void)call();
  drain(device);
  const double per = std::max(0.01, (now_us() - t0) / 10);
  t.calls = std::max(10, int(budget_us / per));
  std::vector<double> means;
  for (int b = 0; b < batches; ++b) {
    drain(device);
    const double start = now_us();
    for (int i = 0; i < t.calls; ++i) (void)call();
    means.push_back((now_us() - start) / t.calls);
  }
  drain(device);
  std::sort(means.begin(), means.end());
  t.us = means[means.size() / 2];
  return t;
}

struct Record {
  std::string backend, layout, path, direction;
  Timing timing;
};

bool gpu_present() {
#if defined(STRIDEATTN_BENCH_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    o += ch;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Sizes z;
  int batches = 15;
  double budget_us = 20000;
  std::string json_path, commit = "unknown", machine = "unknown";
  bool fake_only = false;
  std::string profile;  // per_call | plan_run: only N calls on the no-work backend (for a profiler)
  int profile_calls = 100000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--json") {
      json_path = next();
    } else if (a == "--commit") {
      commit = next();
    } else if (a == "--machine") {
      machine = next();
    } else if (a == "--batches") {
      batches = std::max(3, std::atoi(next()));
    } else if (a == "--budget-ms") {
      budget_us = 1000.0 * std::max(1.0, std::atof(next()));
    } else if (a == "--seqlen") {
      z.s = std::max(1, std::atoi(next()));
    } else if (a == "--fake-only") {
      fake_only = true;
    } else if (a == "--profile") {
      profile = next();
    } else if (a == "--calls") {
      profile_calls = std::max(1, std::atoi(next()));
    } else {
      std::fprintf(stderr,
                   "usage: bench_dispatch [--json PATH] [--commit C] [--machine M] [--batches N] [--budget-ms MS] "
                   "[--seqlen S] [--fake-only] [--profile per_call|plan_run --calls N]\n");
      return 2;
    }
  }
  if (!profile.empty()) {
    // N forward + backward calls on the no-work backend and nothing else, to run under a
    // profiler (valgrind --tool=callgrind: instructions per call; perf record).
    FakeBackend fake;
    detail::ScopedBackendOverride o({{Backend::cpu, &fake}});
    Case c = make_case(z, "fused", Memory::host, Backend::cpu);
    std::function<Status()> call = [&] {
      Status s = forward(c.fwd);
      return s.ok() ? backward(c.bwd) : s;
    };
    if (profile == "plan_run") {
      ForwardPlan fp;
      BackwardPlan bp;
      if (!make_plan(c.fwd, &fp).ok() || !make_plan(c.bwd, &bp).ok()) return 1;
      ForwardRun fr;
      fr.q = c.fwd.q.data, fr.k = c.fwd.k.data, fr.v = c.fwd.v.data, fr.o = c.fwd.o.data, fr.lse = c.fwd.lse.data;
      BackwardRun br;
      br.q = fr.q, br.k = fr.k, br.v = fr.v, br.o = fr.o, br.d_o = c.bwd.d_o.data, br.lse = fr.lse;
      br.dq = c.bwd.dq.data, br.dk = c.bwd.dk.data, br.dv = c.bwd.dv.data;
      call = [&, fp, bp, fr, br] {
        Status s = fp.run(fr);
        return s.ok() ? bp.run(br) : s;
      };
    }
    for (int i = 0; i < profile_calls; ++i)
      if (!call().ok()) return 1;
    std::printf("bench_dispatch: %d %s calls (forward + backward, fused views, no-work backend)\n", profile_calls,
                profile.c_str());
    return 0;
  }
  std::printf("bench_dispatch: b=%lld s=%lld h=%lld hg=%lld d=%lld bf16 causal; us per call, median of %d batches\n",
              (long long)z.b, (long long)z.s, (long long)z.h, (long long)z.hg, (long long)z.d, batches);
  std::vector<Record> records;
  auto add = [&](const std::string& backend, const std::string& layout, const std::string& path, const std::string& dir,
                 Timing t) {
    records.push_back({backend, layout, path, dir, t});
    if (t.us < 0)
      std::printf("  %-9s %-6s %-10s %-8s  error: %s\n", backend.c_str(), layout.c_str(), path.c_str(), dir.c_str(),
                  t.error.c_str());
    else
      std::printf("  %-9s %-6s %-10s %-8s %10.2f us  (%d calls per batch)\n", backend.c_str(), layout.c_str(),
                  path.c_str(), dir.c_str(), t.us, t.calls);
    std::fflush(stdout);
  };
  // Each backend: per-call forward, and forward + backward.
  auto time_backend = [&](const std::string& name, Backend backend, Memory memory) {
    const bool device = memory == Memory::device;
    for (const char* layout : {"bshd", "fused"}) {
      Case c = make_case(z, layout, memory, backend);
      if (device && !attach_workspace(&c)) {
        add(name, layout, "per_call", "fwd", Timing{-1, 0, "workspace_size failed"});
        continue;
      }
      add(name, layout, "per_call", "fwd", time_calls([&] { return forward(c.fwd); }, device, batches, budget_us));
      add(name, layout, "per_call", "fwd+bwd",
          time_calls(
              [&] {
                Status s = forward(c.fwd);
                return s.ok() ? backward(c.bwd) : s;
              },
              device, batches, budget_us));
      // Plans made once (pointers given at run time), run with the case's pointers.
      ForwardArgs fa = c.fwd;
      fa.q.data = fa.k.data = fa.v.data = fa.o.data = nullptr;
      fa.lse.data = nullptr;
      BackwardArgs ba = c.bwd;
      ba.q.data = ba.k.data = ba.v.data = ba.o.data = ba.d_o.data = ba.dq.data = ba.dk.data = ba.dv.data = nullptr;
      ba.lse.data = nullptr;
      ForwardPlan fp;
      BackwardPlan bp;
      if (Status s = make_plan(fa, &fp); !s.ok()) {
        add(name, layout, "plan_run", "fwd", Timing{-1, 0, s.message()});
        continue;
      }
      if (Status s = make_plan(ba, &bp); !s.ok()) {
        add(name, layout, "plan_run", "fwd+bwd", Timing{-1, 0, s.message()});
        continue;
      }
      ForwardRun fr;
      fr.q = c.fwd.q.data, fr.k = c.fwd.k.data, fr.v = c.fwd.v.data, fr.o = c.fwd.o.data, fr.lse = c.fwd.lse.data;
      fr.workspace = c.fwd.workspace, fr.workspace_bytes = c.fwd.workspace_bytes;
      BackwardRun br;
      br.q = fr.q, br.k = fr.k, br.v = fr.v, br.o = fr.o, br.d_o = c.bwd.d_o.data, br.lse = fr.lse;
      br.dq = c.bwd.dq.data, br.dk = c.bwd.dk.data, br.dv = c.bwd.dv.data;
      br.workspace = c.bwd.workspace, br.workspace_bytes = c.bwd.workspace_bytes;
      add(name, layout, "plan_run", "fwd", time_calls([&] { return fp.run(fr); }, device, batches, budget_us));
      add(name, layout, "plan_run", "fwd+bwd",
          time_calls(
              [&] {
                Status s = fp.run(fr);
                return s.ok() ? bp.run(br) : s;
              },
              device, batches, budget_us));
      // Making the plans (validation, selection, the backend's preparation; cached graphs stay
      // cached, so on cudnn this is the graph lookup, not the build).
      add(name, layout, "plan_make", "fwd",
          time_calls(
              [&] {
                ForwardPlan p;
                return make_plan(fa, &p);
              },
              device, batches, budget_us));
    }
  };
  {
    FakeBackend fake;
    detail::ScopedBackendOverride o({{Backend::cpu, &fake}});
    time_backend("fake", Backend::cpu, Memory::host);
  }
  if (!fake_only) {
    time_backend("reference", Backend::reference, Memory::host);
    time_backend("cpu", Backend::cpu, Memory::host);
    if (gpu_present()) {
      for (Backend b : {Backend::cuda, Backend::cudnn})
        if (backend_compiled(b)) time_backend(std::string(to_string(b)), b, Memory::device);
      time_backend("auto", Backend::automatic, Memory::device);
    }
  }
  if (!json_path.empty()) {
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_dispatch: cannot write %s\n", json_path.c_str());
      return 1;
    }
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    std::fprintf(f,
                 "{\n  \"kind\": \"host_overhead\",\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n  \"machine\": "
                 "\"%s\",\n  \"library\": \"%s\",\n  \"problem\": {\"b\": %lld, \"s\": %lld, \"h\": %lld, \"hg\": "
                 "%lld, \"d\": %lld, \"dtype\": \"bf16\", \"mask\": \"causal\"},\n  \"unit\": \"us per call, median "
                 "of %d batches of the mean\",\n  \"records\": [\n",
                 date, json_escape(commit).c_str(), json_escape(machine).c_str(), std::string(version()).c_str(),
                 (long long)z.b, (long long)z.s, (long long)z.h, (long long)z.hg, (long long)z.d, batches);
    for (std::size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      std::fprintf(f,
                   "    {\"backend\": \"%s\", \"layout\": \"%s\", \"path\": \"%s\", \"direction\": \"%s\", "
                   "\"us\": %s, \"calls_per_batch\": %d%s%s%s}%s\n",
                   r.backend.c_str(), r.layout.c_str(), r.path.c_str(), r.direction.c_str(),
                   r.timing.us < 0 ? "null" : std::to_string(r.timing.us).c_str(), r.timing.calls,
                   r.timing.error.empty() ? "" : ", \"error\": \"", json_escape(r.timing.error).c_str(),
                   r.timing.error.empty() ? "" : "\"", i + 1 < records.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
