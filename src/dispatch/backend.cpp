// The default preparation of BackendImpl (backend.hpp): the workspace size computed once, and
// forward() / backward() per run, for backends without a preparation of their own.
#include "dispatch/backend.hpp"

namespace strideattn::detail {

namespace {

class PerCallAdapter final : public PreparedCall {
 public:
  PerCallAdapter(BackendImpl* impl, std::size_t workspace, bool backward)
      : impl_(impl), workspace_(workspace), backward_(backward) {}
  [[nodiscard]] std::size_t workspace_bytes() const override { return workspace_; }
  [[nodiscard]] Status run(const Problem& problem) const override {
    return backward_ ? impl_->backward(problem) : impl_->forward(problem);
  }

 private:
  BackendImpl* impl_;
  std::size_t workspace_;
  bool backward_;
};

}  // namespace

Status BackendImpl::prepare_call(const Problem& problem, std::unique_ptr<const PreparedCall>* out) {
  std::size_t bytes = 0;
  if (Status s = workspace_size(problem, &bytes); !s.ok()) return s;
  *out = std::make_unique<PerCallAdapter>(this, bytes, problem.is_backward());
  return Status::Ok();
}

}  // namespace strideattn::detail
