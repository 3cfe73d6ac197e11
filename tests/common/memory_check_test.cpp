// The check that tensor pointers live where `memory` says (common/memory_check.hpp): the
// accept/refuse table, the error text, every tensor of both directions and of KV-cache
// attention and dropout's seed and offset pointers, walked with a fake pointer classifier
// (the CUDA query needs a GPU; tests/backends/cuda covers it there), and real host memory
// passing the real classifier through the public forward().
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/memory_check.hpp"
#include "dispatch/gpu_module.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::detail {
namespace {

TEST(MemoryCheck, AcceptsWhatEachSideCanReadAndNamesTheMismatch) {
  using K = PointerKind;
  for (K k : {K::unknown, K::host, K::pinned_host, K::managed})
    EXPECT_FALSE(memory_mismatch("q", Memory::host, k)) << to_string(k);
  for (K k : {K::unknown, K::device, K::pinned_host, K::managed})
    EXPECT_FALSE(memory_mismatch("q", Memory::device, k)) << to_string(k);
  EXPECT_EQ(memory_mismatch("k", Memory::host, K::device).value_or(""),
            "k.data points to device memory but memory is host; pass memory = device for these "
            "tensors, or copy them to the host");
  EXPECT_EQ(memory_mismatch("dv", Memory::device, K::host).value_or(""),
            "dv.data points to host memory but memory is device; pass memory = host for these "
            "tensors, or copy them to the device");
}

// A fake classifier: the one pointer `g_device` is device memory, everything else host.
const void* g_device = nullptr;
std::vector<const void*> g_asked;
PointerKind fake(const void* p) {
  g_asked.push_back(p);
  return p == g_device ? PointerKind::device : PointerKind::host;
}

TEST(MemoryCheck, EveryForwardTensorIsChecked) {
  char buf[8];
  ForwardArgs a;
  a.q.data = buf, a.k.data = buf + 1, a.v.data = buf + 2, a.o.data = buf + 3;
  g_device = nullptr, g_asked.clear();
  EXPECT_TRUE(check_memory(a, &fake).ok());
  EXPECT_EQ(g_asked.size(), 4u);  // absent LSE and workspace are not asked about
  const std::pair<const char*, void*> tensors[] = {{"q", buf},     {"k", buf + 1},   {"v", buf + 2},
                                                   {"o", buf + 3}, {"lse", buf + 4}, {"workspace", buf + 5}};
  a.lse.data = reinterpret_cast<float*>(buf + 4);
  a.workspace = buf + 5;
  for (const auto& [name, ptr] : tensors) {
    g_device = ptr;
    const Status s = check_memory(a, &fake);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(s.message().rfind(std::string(name) + ".data points to device memory", 0), 0u) << s.message();
  }
  a.memory = Memory::device;  // now every host pointer is the mismatch; q comes first
  g_device = nullptr;
  EXPECT_EQ(check_memory(a, &fake).message().rfind("q.data points to host memory but memory is device", 0), 0u);
}

TEST(MemoryCheck, EveryBackwardTensorIsChecked) {
  char buf[16];
  BackwardArgs a;
  TensorView* views[] = {&a.q, &a.k, &a.v, &a.o, &a.d_o, &a.dq, &a.dk, &a.dv};
  for (int i = 0; i < 8; ++i) views[i]->data = buf + i;
  a.lse.data = reinterpret_cast<float*>(buf + 8);
  a.workspace = buf + 9;
  const std::pair<const char*, const void*> tensors[] = {
      {"q", buf},      {"k", buf + 1},  {"v", buf + 2},  {"o", buf + 3},   {"d_o", buf + 4},
      {"dq", buf + 5}, {"dk", buf + 6}, {"dv", buf + 7}, {"lse", buf + 8}, {"workspace", buf + 9}};
  g_device = nullptr, g_asked.clear();
  EXPECT_TRUE(check_memory(a, &fake).ok());
  EXPECT_EQ(g_asked.size(), 10u);
  for (const auto& [name, ptr] : tensors) {
    g_device = ptr;
    const Status s = check_memory(a, &fake);
    EXPECT_EQ(s.message().rfind(std::string(name) + ".data points to device memory", 0), 0u) << s.message();
  }
}

// Dropout's seed and offset pointers (read by the kernels when the call runs) are checked
// like the tensors, named as pointers, and only when dropout is on.
TEST(MemoryCheck, DropoutSeedAndOffsetPointersAreChecked) {
  char buf[8];
  std::uint64_t seed = 1, offset = 2;
  for (bool fwd : {true, false}) {
    SCOPED_TRACE(fwd ? "forward" : "backward");
    ForwardArgs f;
    BackwardArgs bw;
    AttentionOptions& o = fwd ? f.options : bw.options;
    f.q.data = buf, bw.q.data = buf;
    o.dropout = {0.0, 0, 0, &seed, &offset};
    auto check = [&] { return fwd ? check_memory(f, &fake) : check_memory(bw, &fake); };
    g_device = &seed, g_asked.clear();
    EXPECT_TRUE(check().ok());  // p = 0: the pointers are never read
    EXPECT_EQ(g_asked.size(), 1u);
    o.dropout.p = 0.1;
    for (const auto& [name, ptr] : {std::pair{"dropout.seed_ptr", static_cast<const void*>(&seed)},
                                    std::pair{"dropout.offset_ptr", static_cast<const void*>(&offset)}}) {
      g_device = ptr;
      const Status s = check();
      EXPECT_EQ(s.code(), StatusCode::invalid_argument) << name;
      EXPECT_EQ(s.message().rfind(std::string(name) + " points to device memory but memory is host", 0), 0u)
          << s.message();
    }
    g_device = nullptr;
    EXPECT_TRUE(check().ok());
  }
}

// KV-cache attention: every view and both int32 arrays, the lengths a GPU kernel reads too.
TEST(MemoryCheck, EveryKvCacheTensorIsChecked) {
  char buf[16];
  KvCacheArgs a;
  a.q.data = buf, a.k_cache.data = buf + 1, a.v_cache.data = buf + 2, a.o.data = buf + 3;
  a.cache_seqlens = reinterpret_cast<const std::int32_t*>(buf + 4);
  g_device = nullptr, g_asked.clear();
  EXPECT_TRUE(check_memory(a, &fake).ok());
  EXPECT_EQ(g_asked.size(), 5u);  // absent new tokens, table, seqlens_q, LSE, workspace: not asked
  a.k_new.data = buf + 5, a.v_new.data = buf + 6, a.lse.data = reinterpret_cast<float*>(buf + 7);
  a.block_table.data = reinterpret_cast<const std::int32_t*>(buf + 8);
  a.seqlens_q = reinterpret_cast<const std::int32_t*>(buf + 9);
  a.workspace = buf + 10;
  const std::pair<const char*, const void*> tensors[] = {{"q", buf},
                                                         {"k_cache", buf + 1},
                                                         {"v_cache", buf + 2},
                                                         {"o", buf + 3},
                                                         {"cache_seqlens", buf + 4},
                                                         {"k_new", buf + 5},
                                                         {"v_new", buf + 6},
                                                         {"lse", buf + 7},
                                                         {"block_table", buf + 8},
                                                         {"seqlens_q", buf + 9},
                                                         {"workspace", buf + 10}};
  for (const auto& [name, ptr] : tensors) {
    g_device = ptr;
    const Status s = check_memory(a, &fake);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << name;
    EXPECT_EQ(s.message().rfind(std::string(name) + ".data points to device memory", 0), 0u) << s.message();
  }
}

TEST(MemoryCheck, HostMemoryIsNeverTakenForDevice) {
  std::vector<float> host(16);
  // the GPU module's query, where a module is loaded
  const strideattn::detail::GpuModuleLoad& m = strideattn::detail::gpu_module();
  if (m.module != nullptr && m.module->classify_pointer != nullptr) {
    const PointerKind k = m.module->classify_pointer(host.data());
    EXPECT_TRUE(k == PointerKind::host || k == PointerKind::unknown) << to_string(k);
  }
  // and the public call on host memory still runs (the check refuses nothing here)
  const std::int64_t s = 3, h = 1, d = 4;
  std::vector<float> q(s * h * d, 0.5f), o(s * h * d, -1.0f);
  ForwardArgs a;
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.o}) {
    t->dtype = DType::f32, t->shape = {1, s, h, d}, t->stride = {s * h * d, h * d, d, 1};
    t->data = q.data();
  }
  a.o.data = o.data();
  a.backend = Backend::cpu;
  const Status st = forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  for (float x : o) EXPECT_FLOAT_EQ(x, 0.5f);  // every V row is 0.5: so is every output
}

}  // namespace
}  // namespace strideattn::detail
