// Dropout on the `cuda` backend (docs/semantics.md "Dropout"; the kernels' feature variant,
// src/backends/cuda/common/dropout.cuh), forward and backward:
//   - against the fp64 reference under the correctness rule through the harness runner (fresh
//     random inputs, poisoned outputs, guard bands, written checks): p 0.1 and 0.5, every head-
//     dim bucket, f16 and bf16, masks and windows, GQA/MQA, varlen with padding, with every
//     other feature, every dK/dV kernel and both backward forms, deterministic mode, the
//     forward's fold;
//   - the keep mask bit for bit: Q = 0 (every P equal), V and dO one-hot, so that O and dV
//     are Z P exactly, against the mask computed on the host from common/philox.hpp (the
//     code `cpu` runs) and against the reference backend's O; a wrong seed or offset must
//     make that comparison fail;
//   - seed and offset from device pointers: the same bits as the values, a CUDA graph
//     captured once and replayed after writing new seeds (each replay against the host mask
//     and the reference for its seed), and a host pointer refused by name.
// Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/test_hook.hpp"
#include "common/dtype.hpp"
#include "common/philox.hpp"
#include "harness/runner.hpp"
#include "strideattn/strideattn.hpp"
#include "support/backend_case.hpp"

namespace {

using strideattn::Backend;
using strideattn::DType;
using strideattn::MaskKind;
using strideattn::Memory;
using strideattn::TensorView;
using strideattn::cuda_impl::Arch;
using strideattn::cuda_impl::PlanForcing;
using strideattn::cuda_impl::ScopedCudaPlanForcing;
using strideattn::harness::CaseReport;
using strideattn::harness::CaseSpec;
using i64 = std::int64_t;

#define SKIP_WITHOUT_GPU()                    \
  if (!strideattn::harness::gpu_available())  \
  GTEST_SKIP() << "no CUDA GPU present: the " \
                  "cuda dropout tests need one"

constexpr strideattn::test_support::DenseCaseBuilder dense{.seed_offset = 191};
constexpr strideattn::test_support::VarlenCaseBuilder varlen{
    .seed_base = 19191, .head_dim = 64, .head_dim_in_seed = true};

CaseSpec with_dropout(CaseSpec s, double p, std::uint64_t seed = 0x0123456789abcdefull,
                      std::uint64_t offset = 0xfffffffffffffffdull) {  // b * h + head carries
  s.options.dropout = {p, seed, offset, nullptr, nullptr};
  return s;
}

// The other features, as cuda_features_test.cpp's kAll.
CaseSpec with_all(CaseSpec s) {
  s.options.softcap = 5.0;
  s.features.alibi_rows = 1;
  s.features.sinks = true;
  s.features.max_logit = true;
  s.input_scale = 1.5;
  return s;
}

// cuda runs `spec` and passes: status ok, every output written, guards intact, and O, LSE,
// dQ, dK, dV (and the other features' outputs) checked, never vacuously.
void expect_cuda_ok(CaseSpec spec) {
  if (!spec.layout_name.empty()) {
    const strideattn::Status s = strideattn::harness::make_layout_views(spec.layout_name, spec.sizes, &spec.views);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  CaseReport report;
  const strideattn::Status s = strideattn::harness::run_case(spec, {Backend::cuda}, &report);
  const std::string repro = strideattn::harness::reproducer(spec, {Backend::cuda});
  ASSERT_TRUE(s.ok()) << s.message() << "\n  " << repro;
  ASSERT_EQ(report.backends.size(), 1u);
  const auto& r = report.backends[0];
  EXPECT_EQ(r.status, "ok") << r.reason << "\n  " << repro;
  EXPECT_TRUE(r.guard_ok) << repro;
  EXPECT_TRUE(r.written_ok) << repro;
  std::size_t want = spec.grad ? 5 : 2;
  if (spec.features.max_logit) ++want;
  if (spec.grad && spec.features.sinks) ++want;
  if (spec.grad && spec.features.bias) ++want;
  EXPECT_EQ(r.checks.size(), want) << repro;
}

// ------------------------------------------------------------------ against the reference

TEST(CudaDropout, EveryBucketDtypeAndProbability) {
  SKIP_WITHOUT_GPU();
  for (i64 d : {64, 128, 256})
    for (DType t : {DType::f16, DType::bf16})
      for (double p : {0.1, 0.5}) {
        SCOPED_TRACE(::testing::Message() << "d " << d << " " << strideattn::to_string(t) << " p " << p);
        expect_cuda_ok(with_dropout(dense(t, 2, 150, 170, 4, 2, d, d, MaskKind::causal_bottom_right), p));
      }
}

TEST(CudaDropout, EveryMaskAndWindowGroupedAndOddDims) {
  SKIP_WITHOUT_GPU();
  const i64 windows[][2] = {{-1, -1}, {16, 0}, {5, 40}, {40, 5}, {0, 0}};
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right})
    for (const auto& w : windows) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " window " << w[0] << "," << w[1]);
      expect_cuda_ok(with_dropout(dense(DType::bf16, 2, 130, 200, 4, 2, 64, 64, m, w[0], w[1]), 0.1));
      expect_cuda_ok(with_dropout(dense(DType::f16, 1, 200, 130, 2, 1, 128, 128, m, w[0], w[1]), 0.5));
    }
  expect_cuda_ok(with_dropout(dense(DType::bf16, 2, 150, 150, 8, 2, 64, 64, MaskKind::causal), 0.1));  // GQA 4
  expect_cuda_ok(with_dropout(dense(DType::bf16, 1, 100, 180, 6, 1, 128, 128, MaskKind::none), 0.5));  // MQA
  expect_cuda_ok(with_dropout(dense(DType::f16, 1, 180, 100, 6, 3, 40, 24, MaskKind::causal_bottom_right), 0.1));
  expect_cuda_ok(with_dropout(dense(DType::bf16, 1, 150, 150, 2, 1, 192, 128, MaskKind::causal), 0.5));
  expect_cuda_ok(with_dropout(dense(DType::bf16, 2, 1, 300, 4, 2, 128, 128, MaskKind::causal_bottom_right), 0.1));
  // rows that see no key and keys no query sees
  expect_cuda_ok(with_dropout(dense(DType::bf16, 1, 250, 40, 2, 1, 64, 64, MaskKind::none, 3, 3), 0.5));
}

// Varlen (thd) with empty sequences and gaps between them: the batch index of the Philox
// counter is the sequence's.
TEST(CudaDropout, VarlenWithPadding) {
  SKIP_WITHOUT_GPU();
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right})
    for (double p : {0.1, 0.5}) {
      SCOPED_TRACE(::testing::Message() << "mask " << int(m) << " p " << p);
      expect_cuda_ok(with_dropout(
          varlen(DType::bf16, {40, 0, 75, 130}, {50, 9, 70, 140}, {0, 45, 50, 130}, {0, 55, 70, 150}, m), p));
      expect_cuda_ok(with_dropout(
          varlen(DType::f16, {90, 20}, {30, 160}, {3, 100}, {0, 40}, m, 12, 0, std::int64_t(256)), p, 7, 3));
    }
}

TEST(CudaDropout, WithEveryOtherFeature) {
  SKIP_WITHOUT_GPU();
  for (i64 d : {64, 128, 256}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    expect_cuda_ok(with_all(with_dropout(dense(DType::bf16, 2, 150, 170, 8, 2, d, d, MaskKind::causal), 0.1)));
  }
}

// Every dK/dV kernel (sm_90a wgmma by default on an H200; the sm80 8-warp pass at d <= 128,
// the 4-warp pass where shared memory is short and at d 256), the single-pass and the
// two-pass backward (whose dQ pass draws the mask again), group splits and the folds.
TEST(CudaDropout, EveryBackwardKernelAndForm) {
  SKIP_WITHOUT_GPU();
  const CaseSpec cases[] = {
      with_dropout(dense(DType::bf16, 2, 150, 170, 8, 2, 64, 64, MaskKind::causal), 0.1),
      with_dropout(dense(DType::f16, 1, 170, 150, 4, 1, 128, 128, MaskKind::causal_bottom_right, 30, 10), 0.5),
      with_dropout(dense(DType::bf16, 1, 130, 130, 2, 1, 256, 256, MaskKind::none), 0.1),
  };
  std::vector<PlanForcing> forcings;
  for (std::optional<Arch> arch : {std::optional<Arch>{}, std::optional<Arch>{Arch::sm80}})
    for (bool single : {true, false}) {
      forcings.push_back(PlanForcing{.arch = arch, .single_pass = single});
      forcings.push_back(PlanForcing{.arch = arch, .group_splits = 2, .single_pass = single, .fold_blocks = 1});
    }
  int n = 0;
  for (const PlanForcing& f : forcings) {
    SCOPED_TRACE(::testing::Message() << "forcing " << n++);
    const ScopedCudaPlanForcing forced(f);
    for (const CaseSpec& c : cases) expect_cuda_ok(c);
  }
  const ScopedCudaPlanForcing forced(PlanForcing{.arch = Arch::sm80, .smem_optin = 99 * 1024});
  expect_cuda_ok(cases[0]);
  expect_cuda_ok(cases[1]);
}

TEST(CudaDropout, DeterministicBackward) {
  SKIP_WITHOUT_GPU();
  for (double p : {0.1, 0.5}) {
    CaseSpec c = with_dropout(dense(DType::bf16, 3, 400, 400, 4, 2, 128, 128, MaskKind::causal), p);
    c.options.deterministic = true;
    expect_cuda_ok(c);
    CaseSpec v =
        with_dropout(varlen(DType::f16, {40, 0, 75}, {50, 9, 70}, {0, 45, 50}, {0, 55, 70}, MaskKind::causal), p);
    v.options.deterministic = true;
    expect_cuda_ok(v);
  }
}

// Rows over more than kFoldKeys keys: the forward's fold with dropout.
TEST(CudaDropout, LongKeyRangesFold) {
  SKIP_WITHOUT_GPU();
  expect_cuda_ok(with_dropout(
      dense(DType::bf16, 1, 40, 17000, 2, 1, 128, 128, MaskKind::causal_bottom_right, -1, -1, false), 0.1));
}

// ------------------------------------------------------------------ the mask, bit for bit

float to_float(DType t, std::uint16_t x) {
  return t == DType::bf16 ? strideattn::detail::bf16_to_float(x) : strideattn::detail::f16_to_float(x);
}
std::uint16_t from_float(DType t, float x) {
  return t == DType::bf16 ? strideattn::detail::float_to_bf16(x) : strideattn::detail::float_to_f16(x);
}

// A device buffer, freed at scope exit: a copy of `host`, or NaN-poisoned.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes, const void* host = nullptr) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    if (host)
      EXPECT_EQ(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(ptr, 0xff, bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Q = 0, so every logit is 0 and P = 1/n in every row (n keys, no mask; n a power of two); V
// row j and dO row i are one-hot (column j, column i; n = d). Then O[i, c] = Z[i, c] / n and
// dV[j, c] = Z[c, j] / n exactly, which with p = 0.5 (Z = 2 or 0) are 2/n or 0 in f16 and
// bf16: O and dV show the keep mask of the forward and of the dK/dV pass exactly. MHA, dense
// [b, n, h, n] tensors.
struct MaskCase {
  DType dtype = DType::bf16;
  i64 b = 2, h = 2, n = 64;
  double p = 0.5;
  std::vector<std::uint16_t> q, k, v, d_o;

  [[nodiscard]] std::size_t elems() const { return std::size_t(b * n * h * n); }
  [[nodiscard]] std::size_t index(i64 bb, i64 row, i64 hh, i64 c) const {
    return std::size_t(((bb * n + row) * h + hh) * n + c);
  }
  void fill(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    q.assign(elems(), from_float(dtype, 0.f));
    k.resize(elems());
    for (auto& x : k) x = from_float(dtype, normal(rng));
    v.assign(elems(), from_float(dtype, 0.f));
    d_o.assign(elems(), from_float(dtype, 0.f));
    for (i64 bb = 0; bb < b; ++bb)
      for (i64 r = 0; r < n; ++r)
        for (i64 hh = 0; hh < h; ++hh) {
          v[index(bb, r, hh, r)] = from_float(dtype, 1.f);
          d_o[index(bb, r, hh, r)] = from_float(dtype, 1.f);
        }
  }
  [[nodiscard]] TensorView view(void* data) const {
    return TensorView{data, dtype, {b, n, h, n}, {n * h * n, h * n, n, 1}};
  }
};

struct MaskRun {
  std::vector<std::uint16_t> o, dv;
};

// The number of elements of O and dV that differ from Z P computed on the host with
// common/philox.hpp for (seed, offset): 0 when the kernels drew the mask of the definition.
i64 mask_mismatches(const MaskCase& c, const MaskRun& r, std::uint64_t seed, std::uint64_t offset) {
  const std::uint32_t threshold = strideattn::kernel::dropout_threshold(c.p);
  const float kept = float(1.0 / (1.0 - c.p)) / float(c.n);
  i64 bad = 0;
  for (i64 bb = 0; bb < c.b; ++bb)
    for (i64 hh = 0; hh < c.h; ++hh)
      for (i64 i = 0; i < c.n; ++i) {
        const auto row = strideattn::kernel::DropoutRow::make(seed, offset, bb, c.h, hh, i, threshold);
        for (i64 j = 0; j < c.n; ++j) {
          const float want = row.keep(j) ? kept : 0.f;
          bad += to_float(c.dtype, r.o[c.index(bb, i, hh, j)]) != want;   // O[i, j] = Z[i, j] / n
          bad += to_float(c.dtype, r.dv[c.index(bb, j, hh, i)]) != want;  // dV[j, i] = Z[i, j] / n
        }
      }
  return bad;
}

// Forward and backward on cuda with the seed and offset as values, or read from `seed_dev` /
// `offset_dev` (device pointers) when given.
MaskRun run_mask_case(const MaskCase& c, std::uint64_t seed, std::uint64_t offset,
                      const std::uint64_t* seed_dev = nullptr, const std::uint64_t* offset_dev = nullptr) {
  const std::size_t bytes = c.elems() * 2;
  DeviceBuffer q(bytes, c.q.data()), k(bytes, c.k.data()), v(bytes, c.v.data()), d_o(bytes, c.d_o.data());
  DeviceBuffer o(bytes), dq(bytes), dk(bytes), dv(bytes), lse(std::size_t(c.b * c.h * c.n) * 4);
  const strideattn::Dropout drop{c.p, seed, offset, seed_dev, offset_dev};
  strideattn::ForwardArgs f;
  f.q = c.view(q.ptr), f.k = c.view(k.ptr), f.v = c.view(v.ptr), f.o = c.view(o.ptr);
  f.lse = strideattn::LseView{static_cast<float*>(lse.ptr), {c.b, c.h, c.n}, {c.h * c.n, c.n, 1}};
  f.options.dropout = drop;
  f.backend = Backend::cuda, f.memory = Memory::device;
  MaskRun r{std::vector<std::uint16_t>(c.elems()), std::vector<std::uint16_t>(c.elems())};
  const strideattn::Status fs = strideattn::forward(f);
  EXPECT_TRUE(fs.ok()) << fs.message();
  strideattn::BackwardArgs bw;
  bw.q = f.q, bw.k = f.k, bw.v = f.v, bw.o = f.o, bw.lse = f.lse, bw.d_o = c.view(d_o.ptr);
  bw.dq = c.view(dq.ptr), bw.dk = c.view(dk.ptr), bw.dv = c.view(dv.ptr);
  bw.options = f.options;
  bw.backend = Backend::cuda, bw.memory = Memory::device;
  const strideattn::Status bs = strideattn::backward(bw);
  EXPECT_TRUE(bs.ok()) << bs.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.o.data(), o.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.dv.data(), dv.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return r;
}

// O of the reference backend on host copies, for (seed, offset) as values.
std::vector<std::uint16_t> reference_o(const MaskCase& c, std::uint64_t seed, std::uint64_t offset) {
  std::vector<std::uint16_t> q = c.q, k = c.k, v = c.v, o(c.elems());
  std::vector<float> lse(std::size_t(c.b * c.h * c.n));
  strideattn::ForwardArgs f;
  f.q = c.view(q.data()), f.k = c.view(k.data()), f.v = c.view(v.data()), f.o = c.view(o.data());
  f.lse = strideattn::LseView{lse.data(), {c.b, c.h, c.n}, {c.h * c.n, c.n, 1}};
  f.options.dropout = {c.p, seed, offset, nullptr, nullptr};
  f.backend = Backend::reference;
  const strideattn::Status s = strideattn::forward(f);
  EXPECT_TRUE(s.ok()) << s.message();
  return o;
}

// Every forward kernel (d 64: mma.sync; 128, 256: wgmma on sm_90a), every dK/dV kernel (the
// forcings) and the sm80 forward: the mask of the definition, bit for bit, equal to the
// reference's; a wrong seed or offset on the host side is caught.
TEST(CudaDropout, MaskIsPhiloxOfTheDefinitionBitForBit) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = 0x0123456789abcdefull, offset = 0xfffffffffffffffdull;
  const std::optional<PlanForcing> forcings[] = {std::nullopt, PlanForcing{.arch = Arch::sm80},
                                                 PlanForcing{.single_pass = false},
                                                 PlanForcing{.arch = Arch::sm80, .smem_optin = 99 * 1024}};
  for (i64 n : {64, 128, 256})
    for (DType t : {DType::bf16, DType::f16}) {
      MaskCase c;
      c.dtype = t, c.n = n;
      c.fill(std::uint64_t(n) + 5);
      for (const auto& forcing : forcings) {
        if (n == 256 && forcing && forcing->smem_optin > 0) continue;  // (no d 256 kernels there)
        SCOPED_TRACE(::testing::Message() << "n " << n << " " << strideattn::to_string(t) << " forcing "
                                          << (forcing ? (forcing->arch ? "sm80" : "two-pass") : "none"));
        std::optional<ScopedCudaPlanForcing> forced;
        if (forcing) forced.emplace(*forcing);
        const MaskRun r = run_mask_case(c, seed, offset);
        EXPECT_EQ(mask_mismatches(c, r, seed, offset), 0);
        // planted errors: the mask of another seed or another offset is not this one
        EXPECT_GT(mask_mismatches(c, r, seed + 1, offset), i64(c.elems() / 4));
        EXPECT_GT(mask_mismatches(c, r, seed, offset + 1), i64(c.elems() / 4));
        EXPECT_EQ(r.o, reference_o(c, seed, offset));
      }
    }
}

// ------------------------------------------------------------------ seed and offset pointers

// Device pointers give the bits the values give; a managed pointer is read too; a host
// pointer with device tensors is refused by name.
TEST(CudaDropout, SeedAndOffsetFromDevicePointers) {
  SKIP_WITHOUT_GPU();
  MaskCase c;
  c.n = 128;
  c.fill(11);
  const std::uint64_t seeds[2] = {42, 7};  // seed, offset
  DeviceBuffer dev(16, seeds);
  const auto* seed_dev = static_cast<const std::uint64_t*>(dev.ptr);
  const MaskRun by_value = run_mask_case(c, 42, 7);
  const MaskRun by_pointer = run_mask_case(c, 0, 0, seed_dev, seed_dev + 1);
  EXPECT_EQ(mask_mismatches(c, by_value, 42, 7), 0);
  EXPECT_EQ(by_pointer.o, by_value.o);
  EXPECT_EQ(by_pointer.dv, by_value.dv);

  std::uint64_t* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 16), cudaSuccess);
  managed[0] = 42, managed[1] = 7;
  const MaskRun by_managed = run_mask_case(c, 0, 0, managed, managed + 1);
  EXPECT_EQ(by_managed.o, by_value.o);
  (void)cudaFree(managed);

  std::uint64_t host_seed = 42;
  DeviceBuffer q(c.elems() * 2, c.q.data()), o(c.elems() * 2);
  strideattn::ForwardArgs f;
  f.q = c.view(q.ptr), f.k = c.view(q.ptr), f.v = c.view(q.ptr), f.o = c.view(o.ptr);
  f.options.dropout = {c.p, 0, 7, &host_seed, nullptr};
  f.backend = Backend::cuda, f.memory = Memory::device;
  const strideattn::Status s = strideattn::forward(f);
  EXPECT_EQ(s.code(), strideattn::StatusCode::invalid_argument);
  // (named as the call's field: dropout.seed_ptr, or dropout_seed_ptr where a cached plan runs)
  EXPECT_NE(s.message().find("seed_ptr points to host memory but memory is device"), std::string::npos) << s.message();
}

// Forward and backward captured once in a CUDA graph (the caller's workspace, global capture
// mode: the calls allocate and synchronise nothing), replayed after writing a new seed and
// offset to the device: each replay draws the mask of what was written, the reference's.
TEST(CudaDropout, GraphReplayReadsNewSeeds) {
  SKIP_WITHOUT_GPU();
  MaskCase c;
  c.n = 128;
  c.fill(13);
  const std::size_t bytes = c.elems() * 2;
  DeviceBuffer q(bytes, c.q.data()), k(bytes, c.k.data()), v(bytes, c.v.data()), d_o(bytes, c.d_o.data());
  DeviceBuffer o(bytes), dq(bytes), dk(bytes), dv(bytes), lse(std::size_t(c.b * c.h * c.n) * 4);
  const std::uint64_t first[2] = {1, 0};
  DeviceBuffer rng(16, first);
  auto* seed_dev = static_cast<std::uint64_t*>(rng.ptr);
  const std::size_t ws_bytes = std::size_t(64) << 20;
  DeviceBuffer ws(ws_bytes);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  strideattn::ForwardArgs f;
  f.q = c.view(q.ptr), f.k = c.view(k.ptr), f.v = c.view(v.ptr), f.o = c.view(o.ptr);
  f.lse = strideattn::LseView{static_cast<float*>(lse.ptr), {c.b, c.h, c.n}, {c.h * c.n, c.n, 1}};
  f.options.dropout = {c.p, 0, 0, seed_dev, seed_dev + 1};
  f.backend = Backend::cuda, f.memory = Memory::device;
  f.stream = stream, f.workspace = ws.ptr, f.workspace_bytes = ws_bytes;
  strideattn::BackwardArgs bw;
  bw.q = f.q, bw.k = f.k, bw.v = f.v, bw.o = f.o, bw.lse = f.lse, bw.d_o = c.view(d_o.ptr);
  bw.dq = c.view(dq.ptr), bw.dk = c.view(dk.ptr), bw.dv = c.view(dv.ptr);
  bw.options = f.options;
  bw.backend = Backend::cuda, bw.memory = Memory::device;
  bw.stream = stream, bw.workspace = ws.ptr, bw.workspace_bytes = ws_bytes;
  ASSERT_TRUE(strideattn::forward(f).ok());  // (first calls: the once-per-device queries, the plans)
  ASSERT_TRUE(strideattn::backward(bw).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const strideattn::Status fs = strideattn::forward(f);
  const strideattn::Status bs = strideattn::backward(bw);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(fs.ok()) << fs.message();
  ASSERT_TRUE(bs.ok()) << bs.message();
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const std::uint64_t replays[][2] = {{1, 0}, {0xdeadbeefcafef00dull, 12}, {1, 0xffffffffffffffffull}, {99, 4}};
  std::vector<std::uint16_t> previous;
  for (const auto& sr : replays) {
    SCOPED_TRACE(::testing::Message() << "seed " << sr[0] << " offset " << sr[1]);
    ASSERT_EQ(cudaMemcpyAsync(seed_dev, sr, 16, cudaMemcpyHostToDevice, stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(o.ptr, 0xff, bytes, stream), cudaSuccess);  // poison between replays
    ASSERT_EQ(cudaMemsetAsync(dv.ptr, 0xff, bytes, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    MaskRun r{std::vector<std::uint16_t>(c.elems()), std::vector<std::uint16_t>(c.elems())};
    ASSERT_EQ(cudaMemcpy(r.o.data(), o.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(r.dv.data(), dv.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(mask_mismatches(c, r, sr[0], sr[1]), 0);
    EXPECT_EQ(r.o, reference_o(c, sr[0], sr[1]));
    EXPECT_NE(r.o, previous);  // a fresh mask each replay
    previous = r.o;
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

}  // namespace
