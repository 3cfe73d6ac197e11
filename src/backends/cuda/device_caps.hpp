// What the kernel choices need to know of a GPU (DeviceCaps), queried once per device and
// cached (device_caps.cu), so that no call of the backend queries device attributes again.
// Plain C++: make_cuda_plan (plan.cpp) is a pure function of a problem and these, and CPU
// tests build them by hand (an A100, an sm_86 card, an H200).
#pragma once

#include "backends/cuda/common/arch.hpp"

namespace strideattn::cuda_impl {

struct DeviceCaps {
  int device = -1;
  int major = 0, minor = 0;  // compute capability
  int sms = 0;               // multiprocessors
  int smem_optin = 0;        // opt-in shared memory per block, bytes
  int smem_per_sm = 0;       // shared memory per multiprocessor, bytes
  bool sm90a_code = false;   // this build carries sm_90a code (CMake's STRIDEATTN_CUDA_SM90A)

  // The architecture whose kernels run here: sm90a on a 9.0 GPU of a build with sm_90a code
  // (the one target those kernels are compiled for), sm80 everywhere else.
  [[nodiscard]] constexpr Arch arch() const {
    return sm90a_code && major == 9 && minor == 0 ? Arch::sm90a : Arch::sm80;
  }
};

// The calling thread's current device: its caps in *out and 0, or the cudaError_t of the
// failed query (no device, no driver), which is also cached (and cleared from the runtime's
// error state). Queried on the first call for each device; later calls cost a cudaGetDevice.
[[nodiscard]] int current_device_caps(DeviceCaps* out);

}  // namespace strideattn::cuda_impl
