// A progress line on stderr for long runs (fuzz, and check/bench past a delay): shown only
// when stderr is a terminal and the output is not --json, rewritten in place, erased when
// the run ends so that it never mixes with the report.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace strideattn::cli {

class ProgressLine {
 public:
  // `delay_s`: show nothing until the run has taken this long.
  ProgressLine(bool json, double delay_s)
      : enabled_(!json && isatty(STDERR_FILENO) == 1), delay_s_(delay_s), start_(std::chrono::steady_clock::now()) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() { clear(); }

  void show(const std::string& what) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (elapsed < delay_s_) return;
    std::fprintf(stderr, "\r\033[Kstrideattn: %s", what.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  // Erase the line (before printing a report line to the same terminal, and at the end).
  void clear() {
    if (!shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  double delay_s_;
  std::chrono::steady_clock::time_point start_;
  bool shown_ = false;
};

}  // namespace strideattn::cli
