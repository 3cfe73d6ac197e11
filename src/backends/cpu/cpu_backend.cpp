// STUB: cpu backend (owner: cpu helper).
#include "dispatch/backend.hpp"
namespace strideattn::detail {
BackendImpl* cpu_backend() { return nullptr; }
}  // namespace strideattn::detail
