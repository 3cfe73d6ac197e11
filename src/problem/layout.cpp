// STUB: layout description (owner: validation helper).
#include "problem/layout.hpp"
namespace strideattn::detail {
std::string describe_layout(const Problem&) { return "unnamed views"; }
}  // namespace strideattn::detail
