// The devices the cuda plan tests describe instead of querying (plans are pure functions of
// the problem and DeviceCaps): an A100 (8.0), a GPU of compute capability 8.6 that grants
// 99 KiB of shared memory per block, and an H200 (9.0), each in a build with sm_90a code.
#pragma once

#include "backends/cuda/device_caps.hpp"

namespace strideattn::cuda_impl::test_devices {

constexpr DeviceCaps kA100{.device = 0,
                           .major = 8,
                           .minor = 0,
                           .sms = 108,
                           .smem_optin = 163 * 1024,
                           .smem_per_sm = 164 * 1024,
                           .sm90a_code = true};
constexpr DeviceCaps kSm86{.device = 1,
                           .major = 8,
                           .minor = 6,
                           .sms = 82,
                           .smem_optin = 99 * 1024,
                           .smem_per_sm = 100 * 1024,
                           .sm90a_code = true};
constexpr DeviceCaps kH200{.device = 0,
                           .major = 9,
                           .minor = 0,
                           .sms = 132,
                           .smem_optin = 227 * 1024,
                           .smem_per_sm = 228 * 1024,
                           .sm90a_code = true};

}  // namespace strideattn::cuda_impl::test_devices
