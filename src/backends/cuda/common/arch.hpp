// The architectures the `cuda` backend has kernels for, as one value that host and device
// code both use: the host picks it once per device (DeviceCaps), every kernel takes it as a
// template parameter, and tile sizes are functions of it (tiles.hpp), so the tile a kernel
// runs with and the one the host sizes its grid and shared memory by cannot differ.
//   sm80   the mma.sync kernels (ldmatrix, cp.async): compute capability 8.0 and above, and
//          what runs on any GPU that is not a 9.0 one with this build's sm_90a code
//   sm90a  H100 / H200 (9.0) in a build with sm_90a code: warpgroup MMAs (wgmma)
// Which device pass builds which kernel bodies: builds_body<A> (a kernel of another
// architecture compiles to an empty body there, as the wgmma kernels do on sm_80).
#pragma once

// A constexpr function host and device code both call (tile sizes, common/tiles.hpp).
#if defined(__CUDACC__)
#define SA_CONSTEXPR_HD __host__ __device__ constexpr
#else
#define SA_CONSTEXPR_HD constexpr
#endif

namespace strideattn::cuda_impl {

enum class Arch : int { sm80 = 0, sm90a = 1 };
inline constexpr int kArchCount = 2;
inline constexpr Arch kArchs[kArchCount] = {Arch::sm80, Arch::sm90a};

SA_CONSTEXPR_HD const char* to_string(Arch a) { return a == Arch::sm90a ? "sm90a" : "sm80"; }

// Which kernels this device compilation pass builds: every target builds the sm80 ones (so
// that on a 9.0 GPU a test can run them on the same inputs as the sm90a ones: the test hook
// of the plan), sm_90a code (the 90a target, __CUDA_ARCH_FEAT_SM90_ALL) also the sm90a ones.
// The host pass builds no bodies (only the launch stubs).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <Arch A>
inline constexpr bool builds_body = true;
#elif defined(__CUDA_ARCH__)
template <Arch A>
inline constexpr bool builds_body = A == Arch::sm80;
#else
template <Arch A>
inline constexpr bool builds_body = false;
#endif

}  // namespace strideattn::cuda_impl
