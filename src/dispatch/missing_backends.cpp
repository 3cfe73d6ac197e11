// Registry entries for the GPU backends this build does not contain (CPU-only builds, or
// CUDA without cuDNN). The selection code reports them as "not part of this build".
#include "dispatch/backend.hpp"

namespace strideattn::detail {

#if !defined(STRIDEATTN_WITH_CUDA)
BackendImpl* cuda_backend() { return nullptr; }
#endif
#if !defined(STRIDEATTN_WITH_CUDNN)
BackendImpl* cudnn_backend() { return nullptr; }
#endif

}  // namespace strideattn::detail
