// `strideattn check` / `explain` / `fuzz` for KV-cache attention (docs/semantics.md "KV cache"):
// a problem described by --cache-seqlens, --page-size, --block-table, --k-cache / --v-cache
// views and friends, run on each backend and judged by the correctness rule against the fp64
// reference; and `fuzz --kv-cache`, random paged and contiguous cases on the host backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strideattn::cli {

// Whether argv[1..] asks for a KV-cache command (check / explain with a KV-cache option, or
// fuzz --kv-cache); main() then hands it to run_kvcache_cli.
[[nodiscard]] bool is_kvcache_command(const std::vector<std::string>& args);

// Runs it; returns the exit code (0 agree, 1 disagree or failure, 2 invalid input).
[[nodiscard]] int run_kvcache_cli(const std::vector<std::string>& args);

}  // namespace strideattn::cli
