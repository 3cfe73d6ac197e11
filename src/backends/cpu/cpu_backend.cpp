// The `cpu` backend: registry entry, support rules, and the host plumbing shared by its
// forward (cpu_forward.cpp) and backward (cpu_backward.cpp): thread count and varlen padding.
#include <cstdlib>
#include <string>
#include <thread>

#include "backends/cpu/cpu_common.hpp"
#include "common/log.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/select.hpp"

namespace strideattn::detail {
namespace cpu {

int thread_count() {
  if (const char* env = std::getenv("STRIDEATTN_CPU_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end && *end == '\0' && n > 0 && n <= 4096) return static_cast<int>(n);
    log_line(LogLevel::info,
             std::string("STRIDEATTN_CPU_THREADS='") + env + "' is not a positive integer; using hardware_concurrency");
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

std::vector<unsigned char> covered_tokens(const kernel::SequenceTable& table, std::int64_t batch, std::int64_t tokens) {
  std::vector<unsigned char> covered(static_cast<std::size_t>(tokens > 0 ? tokens : 0), table.varlen() ? 0 : 1);
  if (!table.varlen()) return covered;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t first = kernel::max64(table.first_token(b), 0);
    const std::int64_t last = kernel::min64(table.first_token(b) + table.length(b), tokens);
    for (std::int64_t t = first; t < last; ++t) covered[static_cast<std::size_t>(t)] = 1;
  }
  return covered;
}

}  // namespace cpu

namespace {

class CpuBackend final : public BackendImpl {
 public:
  // ~90 GFLOP/s forward on the 2-core CI machine (bench/README.md): 1e15 is about 3 hours.
  CpuBackend() : rules_{memory_rule(Memory::host), work_rule(1e15, 9e10)} {}
  [[nodiscard]] Backend id() const override { return Backend::cpu; }
  // Host memory: a plan's run reads cu_seqlens arrays into the lists (problem/cu_seqlens.cpp).
  [[nodiscard]] bool reads_cu_seqlens() const override { return true; }
  [[nodiscard]] bool runs_kv_cache() const override { return true; }
  [[nodiscard]] Status forward_kvcache(const KvCacheProblem& problem) override {
    try {
      return cpu::forward_kvcache(problem);
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::backend_error, "cpu backend: out of host memory for the kv-cache gather");
    } catch (const std::exception& e) {
      return Status(StatusCode::internal, std::string("cpu backend: ") + e.what());
    }
  }
  [[nodiscard]] Verdict supports(const Problem& problem) const override {
    return evaluate_rules(Backend::cpu, rules_, problem);
  }
  [[nodiscard]] Status forward(const Problem& problem) override { return guarded(problem, false); }
  [[nodiscard]] Status backward(const Problem& problem) override { return guarded(problem, true); }

 private:
  // Allocation failure (large head dims times many threads) becomes a status, never an
  // exception out of the API.
  static Status guarded(const Problem& problem, bool backward) {
    try {
      return backward ? cpu::backward(problem) : cpu::forward(problem);
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::backend_error, std::string("cpu backend: out of host memory for the ") +
                                                   (backward ? "backward" : "forward") + " scratch buffers");
    } catch (const std::exception& e) {
      return Status(StatusCode::internal, std::string("cpu backend: ") + e.what());
    }
  }
  std::vector<SupportRule> rules_;
};

}  // namespace

BackendImpl* cpu_backend() {
  static CpuBackend instance;
  return &instance;
}

}  // namespace strideattn::detail
