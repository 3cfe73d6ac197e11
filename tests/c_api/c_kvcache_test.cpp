// The C ABI of KV-cache attention (sa_forward_with_kvcache, sa_explain_kvcache,
// sa_kvcache_workspace_size): the struct has one layout in C and C++; a paged case with an
// append gives the same bytes as the C++ entry point (O, LSE and the caches); struct_size, enum
// and validation errors come back as codes with one-line messages; explain names the
// `kv_cache` verdicts; the workspace query answers as the call would.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "../support/kv_case.hpp"
#include "strideattn/strideattn.h"

extern "C" {
size_t sa_test_kvcache_args_size_c(void);
size_t sa_test_kvcache_cancel_offset_c(void);
}

namespace strideattn::test_support {
namespace {

sa_tensor_view c_view(const TensorView& v) {
  sa_tensor_view c{};
  c.data = v.data;
  c.dtype = static_cast<int32_t>(v.dtype);
  for (int i = 0; i < 4; ++i) c.shape[i] = v.shape[i], c.stride[i] = v.stride[i];
  return c;
}

sa_kvcache_args c_args(const KvCacheArgs& a) {
  sa_kvcache_args c{};
  c.struct_size = sizeof c;
  c.q = c_view(a.q);
  c.k_cache = c_view(a.k_cache);
  c.v_cache = c_view(a.v_cache);
  c.k_new = c_view(a.k_new);
  c.v_new = c_view(a.v_new);
  c.block_table.data = a.block_table.data;
  for (int i = 0; i < 2; ++i)
    c.block_table.shape[i] = a.block_table.shape[i], c.block_table.stride[i] = a.block_table.stride[i];
  c.cache_seqlens = a.cache_seqlens;
  c.seqlens_q = a.seqlens_q;
  c.o = c_view(a.o);
  c.lse.data = a.lse.data;
  for (int i = 0; i < 3; ++i) c.lse.shape[i] = a.lse.shape[i], c.lse.stride[i] = a.lse.stride[i];
  c.options.mask = static_cast<int32_t>(a.options.mask);
  c.backend = static_cast<int32_t>(a.backend);
  return c;
}

KvCase make_case() {
  KvCase c;
  c.page_size = 3;
  c.cache_seqlens = {5, 2};
  c.s_new = 2;
  c.s_q = 2;
  c.seqlens_q = {2, 1};
  c.options.mask = MaskKind::causal_bottom_right;
  c.build();
  return c;
}

TEST(CApiKvCache, StructLayoutIsTheSameInC) {
  EXPECT_EQ(sa_test_kvcache_args_size_c(), sizeof(sa_kvcache_args));
  EXPECT_EQ(sa_test_kvcache_cancel_offset_c(), offsetof(sa_kvcache_args, cancel));
}

TEST(CApiKvCache, MatchesTheCppEntryPoint) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    KvCase a = make_case(), b = make_case();
    ASSERT_TRUE(forward_with_kvcache(a.args(backend)).ok());
    const sa_kvcache_args c = c_args(b.args(backend));
    char msg[256] = "x";
    ASSERT_EQ(sa_forward_with_kvcache(&c, msg, sizeof msg), SA_OK) << msg;
    EXPECT_STREQ(msg, "");
    EXPECT_TRUE(a.o.bytes == b.o.bytes);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_TRUE(a.kc.bytes == b.kc.bytes && a.vc.bytes == b.vc.bytes);
    EXPECT_FALSE(b.kc.bytes == b.kc_before) << "the append wrote the cache";
  }
}

TEST(CApiKvCache, Errors) {
  char msg[512];
  EXPECT_EQ(sa_forward_with_kvcache(nullptr, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sa_kvcache_args is null"), std::string::npos) << msg;
  KvCase k = make_case();
  sa_kvcache_args c = c_args(k.args(Backend::cpu));
  c.struct_size = 8;
  EXPECT_EQ(sa_forward_with_kvcache(&c, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("struct_size is 8"), std::string::npos) << msg;
  c.struct_size = sizeof c;
  c.backend = 9;
  EXPECT_EQ(sa_forward_with_kvcache(&c, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("backend 9"), std::string::npos) << msg;
  c.backend = SA_BACKEND_CPU;
  k.cache_seqlens[1] = 11;  // + 2 new tokens > 12
  EXPECT_EQ(sa_forward_with_kvcache(&c, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("cache_seqlens[1] is 11"), std::string::npos) << msg;
  EXPECT_TRUE(k.outputs_untouched());
  c.backend = SA_BACKEND_CUDA;
  k.cache_seqlens[1] = 2;
  EXPECT_EQ(sa_forward_with_kvcache(&c, msg, sizeof msg), SA_UNSUPPORTED) << msg;
}

// The workspace query, C++ and C: the host backends need none (0, and lengths that would be
// refused at run time are not read), a validation error comes back as the call's would, and a
// backend that cannot run the problem is refused with its rule; nothing is written.
TEST(CApiKvCache, WorkspaceSize) {
  KvCase k = make_case();
  k.cache_seqlens[1] = 11;  // broken, but a size query does not read the lengths
  for (Backend backend : {Backend::reference, Backend::cpu, Backend::automatic}) {
    std::size_t bytes = 77;
    KvCacheArgs a = k.args(backend);
    a.workspace = &bytes;  // ignored by the query
    a.workspace_bytes = 1;
    const Status s = workspace_size(a, &bytes);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(bytes, 0u);
    sa_kvcache_args c = c_args(a);
    std::size_t c_bytes = 77;
    char msg[512] = "x";
    ASSERT_EQ(sa_kvcache_workspace_size(&c, &c_bytes, msg, sizeof msg), SA_OK) << msg;
    EXPECT_STREQ(msg, "");
    EXPECT_EQ(c_bytes, 0u);
  }
  EXPECT_TRUE(k.outputs_untouched());
  EXPECT_TRUE(k.kc.bytes == k.kc_before && k.vc.bytes == k.vc_before);

  char msg[512];
  std::size_t bytes = 77;
  EXPECT_EQ(workspace_size(k.args(Backend::cpu), nullptr).code(), StatusCode::invalid_argument);
  sa_kvcache_args c = c_args(k.args(Backend::cpu));
  EXPECT_EQ(sa_kvcache_workspace_size(&c, nullptr, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("bytes is null"), std::string::npos) << msg;
  EXPECT_EQ(sa_kvcache_workspace_size(nullptr, &bytes, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("sa_kvcache_args is null"), std::string::npos) << msg;
  c.lse.shape[2] = 5;  // not [b, h, s_q]
  bytes = 77;
  EXPECT_EQ(sa_kvcache_workspace_size(&c, &bytes, msg, sizeof msg), SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("lse"), std::string::npos) << msg;
  EXPECT_EQ(bytes, 0u);
  // cuda in host memory (or not built): refused, with its rule
  c = c_args(k.args(Backend::cuda));
  EXPECT_EQ(sa_kvcache_workspace_size(&c, &bytes, msg, sizeof msg), SA_UNSUPPORTED) << msg;
  EXPECT_NE(std::string(msg).find("cuda"), std::string::npos) << msg;
}

TEST(CApiKvCache, ExplainListsTheVerdicts) {
  KvCase k = make_case();
  const sa_kvcache_args c = c_args(k.args(Backend::automatic));
  char buf[4096];
  EXPECT_EQ(sa_explain_kvcache(&c, buf, sizeof buf), SA_OK) << buf;
  const std::string text(buf);
  EXPECT_NE(text.find("layout: paged cache: 10 pages of 3 tokens"), std::string::npos) << text;
  EXPECT_NE(text.find("cpu: supported"), std::string::npos) << text;
  EXPECT_NE(text.find("auto: cpu"), std::string::npos) << text;
}

}  // namespace
}  // namespace strideattn::test_support
