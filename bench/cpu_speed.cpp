// bench_cpu: times the `reference` and `cpu` backends on the speed case (b=1, h=8,
// s=2048, d=64, causal, bf16), forward and forward+backward, median of a few runs in one
// process on the same inputs, and prints the speedup. The issue asks for cpu >= 5x faster
// than reference on a 2-core machine. Options: --runs N (default 3), --seqlen S,
// --threads T (sets STRIDEATTN_CPU_THREADS), --cpu-only (skip the slow reference).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;

struct Buffers {
  std::int64_t b = 1, s = 2048, h = 8, d = 64;
  std::vector<std::uint16_t> q, k, v, o, d_o, dq, dk, dv;  // bf16, bshd contiguous
  std::vector<float> lse;

  void init(std::uint64_t seed) {
    const std::size_t n = static_cast<std::size_t>(b * s * h * d);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    auto fill = [&](std::vector<std::uint16_t>& x) {
      x.resize(n);
      for (auto& e : x) {
        const float f = dist(rng);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        e = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // to bf16
      }
    };
    fill(q), fill(k), fill(v), fill(d_o);
    o.assign(n, 0), dq.assign(n, 0), dk.assign(n, 0), dv.assign(n, 0);
    lse.assign(static_cast<std::size_t>(b * h * s), 0.f);
  }
  strideattn::TensorView view(std::vector<std::uint16_t>& x) {
    strideattn::TensorView t;
    t.data = x.data();
    t.dtype = DType::bf16;
    t.shape = {b, s, h, d};
    t.stride = {s * h * d, h * d, d, 1};
    return t;
  }
  strideattn::LseView lse_view() { return {lse.data(), {b, h, s}, {h * s, s, 1}}; }
};

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

struct Timing {
  double wall_ms = -1;  // median wall time
  double cpu_ms = -1;   // median process CPU time (all threads): robust on a busy machine
};

// Median times of `runs` runs of forward (and backward when `grad`); wall_ms < 0 on error.
Timing time_backend(Buffers& buf, Backend backend, bool grad, int runs) {
  strideattn::ForwardArgs fa;
  fa.q = buf.view(buf.q), fa.k = buf.view(buf.k), fa.v = buf.view(buf.v), fa.o = buf.view(buf.o);
  fa.lse = buf.lse_view();
  fa.options.mask = strideattn::MaskKind::causal;
  fa.backend = backend;
  strideattn::BackwardArgs ba;
  ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.d_o = buf.view(buf.d_o);
  ba.lse = fa.lse;
  ba.dq = buf.view(buf.dq), ba.dk = buf.view(buf.dk), ba.dv = buf.view(buf.dv);
  ba.options = fa.options;
  ba.backend = backend;
  std::vector<double> walls, cpus;
  for (int r = 0; r < runs; ++r) {
    const double t0 = now_ms();
    const std::clock_t c0 = std::clock();
    strideattn::Status st = strideattn::forward(fa);
    if (st.ok() && grad) st = strideattn::backward(ba);
    const std::clock_t c1 = std::clock();
    const double t1 = now_ms();
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", std::string(strideattn::to_string(backend)).c_str(), st.message().c_str());
      return {};
    }
    walls.push_back(t1 - t0);
    cpus.push_back(1000.0 * double(c1 - c0) / CLOCKS_PER_SEC);
  }
  std::sort(walls.begin(), walls.end());
  std::sort(cpus.begin(), cpus.end());
  return {walls[walls.size() / 2], cpus[cpus.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 3;
  bool cpu_only = false;
  Buffers buf;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc)
      runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seqlen" && i + 1 < argc)
      buf.s = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc)
      setenv("STRIDEATTN_CPU_THREADS", argv[++i], 1);
    else if (a == "--cpu-only")
      cpu_only = true;
    else {
      std::fprintf(stderr, "usage: bench_cpu [--runs N] [--seqlen S] [--threads T] [--cpu-only]\n");
      return 2;
    }
  }
  buf.init(42);
  // Causal FLOPs by docs/design.md's convention: 2 * pairs * (d_qk + d_v); backward 2.5x forward.
  const double pairs = double(buf.b * buf.h) * double(buf.s) * double(buf.s + 1) / 2.0;
  const double fwd_flops = 2.0 * pairs * double(2 * buf.d);
  std::printf("bench_cpu: b=%lld h=%lld s=%lld d=%lld causal bf16, median of %d runs\n", (long long)buf.b,
              (long long)buf.h, (long long)buf.s, (long long)buf.d, runs);
  const char* env = std::getenv("STRIDEATTN_CPU_THREADS");
  std::printf("cpu threads: %s\n", env ? env : "hardware_concurrency");
  int rc = 0;
  for (bool grad : {false, true}) {
    const double flops = grad ? fwd_flops * 3.5 : fwd_flops;
    const char* what = grad ? "fwd+bwd" : "fwd    ";
    const Timing cpu = time_backend(buf, Backend::cpu, grad, runs);
    const Timing ref = cpu_only ? Timing{} : time_backend(buf, Backend::reference, grad, runs);
    if (cpu.wall_ms < 0 || (!cpu_only && ref.wall_ms < 0)) rc = 1;
    std::printf("%s  cpu %8.1f ms wall (%6.2f GFLOP/s, %8.1f ms cpu time)", what, cpu.wall_ms,
                flops / (cpu.wall_ms * 1e6), cpu.cpu_ms);
    if (ref.wall_ms > 0)
      std::printf("  reference %8.1f ms wall (%8.1f ms cpu time)  speedup %.1fx wall, %.1fx cpu time", ref.wall_ms,
                  ref.cpu_ms, ref.wall_ms / cpu.wall_ms, ref.cpu_ms / cpu.cpu_ms);
    std::printf("\n");
  }
  return rc;
}
