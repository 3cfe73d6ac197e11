// `cpu` backward (in progress).
#include "backends/cpu/cpu_common.hpp"

namespace strideattn::detail::cpu {
Status backward(const Problem&) {
  return Status(StatusCode::unsupported, "cpu backward: not implemented yet");
}
}  // namespace strideattn::detail::cpu
