// Layout description: names the views in the field's vocabulary (sbhd_sbhd_sbhd, sb3hd,
// bshd_bs2hd, thd_thd_thd, ...) only when their strides and offsets really are that layout,
// otherwise describes what they are. Description only: no kernel reads it.
#pragma once

#include <string>

#include "problem/problem.hpp"

namespace strideattn::detail {

[[nodiscard]] std::string describe_layout(const Problem& problem);

}  // namespace strideattn::detail
