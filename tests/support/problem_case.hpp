// Shared by the problem tests (validate_test, overlap_test): a contiguous bshd view, a
// problem built through make_problem as a status, and EXPECT_INVALID for its message.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "problem/problem.hpp"

namespace strideattn::detail {

// Contiguous bshd view [b, s, h, d] at `data`.
inline TensorView bshd(void* data, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d,
                       DType dtype = DType::f16) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = {b, s, h, d};
  v.stride = {s * h * d, h * d, d, 1};
  return v;
}

template <class Args>
Status check(const Args& args) {
  Problem p;
  return make_problem(args, &p);
}

// The status is invalid_argument and its message holds every piece of `needles`.
#define EXPECT_INVALID(status, ...)                                         \
  do {                                                                      \
    const Status st_ = (status);                                            \
    EXPECT_EQ(st_.code(), StatusCode::invalid_argument) << st_.message();   \
    for (const char* needle_ : {__VA_ARGS__})                               \
      EXPECT_NE(st_.message().find(needle_), std::string::npos)             \
          << "message '" << st_.message() << "' lacks '" << needle_ << "'"; \
    EXPECT_EQ(st_.message().find('\n'), std::string::npos) << "one line";   \
  } while (0)

}  // namespace strideattn::detail
