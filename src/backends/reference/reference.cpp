// STUB: reference backend (owner: reference helper).
#include "backends/reference/reference.hpp"
#include "dispatch/backend.hpp"
namespace strideattn::detail {
ReferenceOutputs reference_compute(const Problem&, RefPrecision) { return {}; }
BackendImpl* reference_backend() { return nullptr; }
}  // namespace strideattn::detail
