// The benchmark protocol (runner.hpp bench_case, docs/design.md): per backend, warm up, then
// the median of the timed runs of the forward (and with grad the backward), timed with CUDA
// events on GPU backends and the wall clock on host memory.
#include <algorithm>
#include <string>
#include <vector>

#include "harness/case_setup.hpp"
#include "harness/device_mirror.hpp"
#include "harness/runner.hpp"

namespace strideattn::harness {

using namespace internal;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Status bench_case(const CaseSpec& spec, const std::vector<Backend>& backends, int runs,
                  std::vector<BenchResult>* results, const Progress& progress) {
  if (results == nullptr) return Status(StatusCode::invalid_argument, "bench_case: results is null");
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
      ForwardArgs fa = forward_args(spec, p.cv, bases, b, mem);
      BackwardArgs ba = spec.grad ? backward_args(spec, p.cv, bases, b, mem) : BackwardArgs{};
      if (spec.cu_seqlens && spec.sizes.varlen()) {
        use_cu_seqlens(spec, bases, &fa.varlen);
        ba.varlen = fa.varlen;
      }
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

}  // namespace strideattn::harness
