// STUB: validation rules (owner: validation helper).
#include "problem/validate.hpp"
namespace strideattn::detail {
Status validate_problem(const Problem&) { return Status::Ok(); }
bool views_overlap(const TensorView&, const TensorView&) { return false; }
}  // namespace strideattn::detail
