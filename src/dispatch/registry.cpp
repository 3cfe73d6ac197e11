// Backend registry: maps the public Backend enum to the implementations in this build.
#include "dispatch/backend.hpp"

namespace strideattn::detail {

BackendImpl* backend_impl(Backend backend) {
  switch (backend) {
    case Backend::reference: return reference_backend();
    case Backend::cpu: return cpu_backend();
    case Backend::cuda: return cuda_backend();
    case Backend::cudnn: return cudnn_backend();
    case Backend::automatic: return nullptr;
  }
  return nullptr;
}

}  // namespace strideattn::detail
