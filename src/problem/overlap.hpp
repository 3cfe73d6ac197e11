// The byte-overlap algebra behind the "outputs must not overlap" rules of validate.cpp: whether
// two strided views share a byte, and whether two elements of one view do, with a witness
// address when they do. Exact where strides allow, conservative otherwise (see overlap.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "strideattn/strideattn.hpp"

namespace strideattn::detail {

// The bytes of a strided view: `rows` contiguous runs of `run` bytes starting at
// base + sum(i_k * stride_k) over the remaining dims (extent > 1, stride >= 0, sorted by
// stride ascending).
struct Region {
  bool empty = false;
  bool representable = true;  // false: spans overflow; treat as "may overlap everything"
  __int128 base = 0;
  __int128 run = 1;
  struct D {
    std::int64_t extent;
    __int128 stride;
  };
  std::vector<D> dims;
  bool nested = false;
  __int128 hi = 0;  // one past the last byte
  __int128 rows = 1;
};

// The bytes of a tensor view (elements of its dtype) and of an LSE view (fp32).
[[nodiscard]] Region region_of(const TensorView& v);
[[nodiscard]] Region region_of(const LseView& v);

struct OverlapResult {
  bool overlap = false;
  bool exact = true;     // false: the conservative answer (enumeration cap or huge spans)
  __int128 witness = 0;  // an absolute byte address in both (when exact and overlapping)
};

// Whether some byte of `a` is a byte of `b`.
[[nodiscard]] OverlapResult overlap_regions(const Region& a, const Region& b);

// Whether two distinct elements of a region share a byte.
[[nodiscard]] OverlapResult self_overlap(const Region& r);

// Two strided views of one dtype overlap in memory (exact where strides allow, see
// overlap.cpp). Exposed for tests.
[[nodiscard]] bool views_overlap(const TensorView& a, const TensorView& b);

}  // namespace strideattn::detail
