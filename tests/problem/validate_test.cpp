// One test per validation rule of the contract: each asserts the status code AND that the
// message names the tensor and the value found. Valid problems (including empty batches,
// size-1 dims with garbage strides, interleaved views) must pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "problem/problem.hpp"
#include "problem/validate.hpp"
#include "support/problem_case.hpp"

namespace strideattn::detail {
namespace {

// A valid forward problem: b=2, s_q=8, s_kv=6, h=4, hg=2, d_qk=16, d_v=8, separate buffers.
struct Fixture : ::testing::Test {
  static constexpr std::int64_t B = 2, SQ = 8, SKV = 6, H = 4, HG = 2, DQK = 16, DV = 8;
  std::vector<std::uint16_t> q_buf = std::vector<std::uint16_t>(B * SQ * H * DQK),
                             k_buf = std::vector<std::uint16_t>(B * SKV * HG * DQK),
                             v_buf = std::vector<std::uint16_t>(B * SKV * HG * DV),
                             o_buf = std::vector<std::uint16_t>(B * SQ * H * DV),
                             do_buf = std::vector<std::uint16_t>(B * SQ * H * DV),
                             dq_buf = std::vector<std::uint16_t>(B * SQ * H * DQK),
                             dk_buf = std::vector<std::uint16_t>(B * SKV * HG * DQK),
                             dv_buf = std::vector<std::uint16_t>(B * SKV * HG * DV);
  std::vector<float> lse_buf = std::vector<float>(B * H * SQ);

  LseView lse() {
    LseView l;
    l.data = lse_buf.data();
    l.shape = {B, H, SQ};
    l.stride = {H * SQ, SQ, 1};
    return l;
  }
  ForwardArgs fwd() {
    ForwardArgs a;
    a.q = bshd(q_buf.data(), B, SQ, H, DQK);
    a.k = bshd(k_buf.data(), B, SKV, HG, DQK);
    a.v = bshd(v_buf.data(), B, SKV, HG, DV);
    a.o = bshd(o_buf.data(), B, SQ, H, DV);
    a.lse = lse();
    return a;
  }
  BackwardArgs bwd() {
    BackwardArgs a;
    a.q = bshd(q_buf.data(), B, SQ, H, DQK);
    a.k = bshd(k_buf.data(), B, SKV, HG, DQK);
    a.v = bshd(v_buf.data(), B, SKV, HG, DV);
    a.o = bshd(o_buf.data(), B, SQ, H, DV);
    a.d_o = bshd(do_buf.data(), B, SQ, H, DV);
    a.lse = lse();
    a.dq = bshd(dq_buf.data(), B, SQ, H, DQK);
    a.dk = bshd(dk_buf.data(), B, SKV, HG, DQK);
    a.dv = bshd(dv_buf.data(), B, SKV, HG, DV);
    return a;
  }
};

using Validate = Fixture;

TEST_F(Validate, ValidForwardAndBackwardPass) {
  EXPECT_TRUE(check(fwd()).ok()) << check(fwd()).message();
  EXPECT_TRUE(check(bwd()).ok()) << check(bwd()).message();
  ForwardArgs a = fwd();
  a.lse = {};  // forward LSE is optional
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

TEST_F(Validate, HeadDimStrideMustBeOneOrMinusOne) {
  ForwardArgs a = fwd();
  a.k.stride = {SKV * HG * DQK * 2, HG * DQK * 2, DQK * 2, 2};
  EXPECT_INVALID(check(a), "k: head-dim stride is 2", "supported: 1, or -1 for a reversed head dim");
  a = fwd();
  a.k.stride[kHeadDim] = -2;
  EXPECT_INVALID(check(a), "k: head-dim stride is -2");
  a = fwd();
  a.k.data = k_buf.data() + DQK - 1;  // k[..., ::-1]
  a.k.stride[kHeadDim] = -1;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  a = fwd();
  a.o.data = v_buf.data() + DV - 1;  // o reversed over v's first row: overlap
  a.o.stride[kHeadDim] = -1;
  EXPECT_INVALID(check(a), "o overlaps v in memory", "o data + -14 bytes is v data + 0 bytes");
}

TEST_F(Validate, NegativeSize) {
  ForwardArgs a = fwd();
  a.q.shape[kSeq] = -3;
  EXPECT_INVALID(check(a), "q:", "seq extent is -3", ">= 0");
}

TEST_F(Validate, ZeroHeadDimInvalid) {
  ForwardArgs a = fwd();
  a.v.shape[kHeadDim] = 0;
  EXPECT_INVALID(check(a), "v:", "head-dim extent is 0");
}

TEST_F(Validate, ZeroHeadsIsNothingToDo) {
  ForwardArgs a = fwd();
  a.q.shape[kHead] = a.k.shape[kHead] = a.v.shape[kHead] = a.o.shape[kHead] = a.lse.shape[1] = 0;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  BackwardArgs b = bwd();
  for (TensorView* t : {&b.q, &b.k, &b.v, &b.o, &b.d_o, &b.dq, &b.dk, &b.dv}) t->shape[kHead] = 0;
  b.lse.shape[1] = 0;
  EXPECT_TRUE(check(b).ok()) << check(b).message();
  // An empty view's strides address nothing: any head-dim stride (numpy on some machines
  // exports 0 for a zero-size array through DLPack), while a non-empty one is still refused.
  a = fwd();
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.o}) t->shape[kHead] = 0, t->stride[kHeadDim] = 0;
  a.lse.shape[1] = 0;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  a = fwd();
  a.q.stride[kHeadDim] = 0;
  EXPECT_INVALID(check(a), "q: head-dim stride is 0");
  // Only one side empty: the query heads have no KV head to read (or KV heads no query).
  a = fwd();
  a.q.shape[kHead] = a.o.shape[kHead] = a.lse.shape[1] = 0;
  EXPECT_INVALID(check(a), "q has 0 heads but k and v have 2", "both 0");
  a = fwd();
  a.k.shape[kHead] = a.v.shape[kHead] = 0;
  EXPECT_INVALID(check(a), "q has 4 heads but k and v have 0");
}

TEST_F(Validate, EmptyBatchOrSequenceIsNothingToDo) {
  ForwardArgs a = fwd();
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.o}) t->shape[kBatch] = 0;
  a.lse.shape[0] = 0;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  a = fwd();
  a.k.shape[kSeq] = a.v.shape[kSeq] = 0;  // no keys: rows give O = 0, LSE = -inf
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  a = fwd();
  a.q.shape[kSeq] = a.o.shape[kSeq] = a.lse.shape[2] = 0;
  a.q.data = a.o.data = nullptr;  // null is fine for an empty view
  a.lse.data = lse_buf.data();
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

TEST_F(Validate, NegativeStridesAreReversedViews) {
  ForwardArgs a = fwd();
  a.q.data = q_buf.data() + (SQ - 1) * H * DQK;  // q[:, ::-1]
  a.q.stride[kSeq] = -H * DQK;
  a.k.data = k_buf.data() + (HG - 1) * DQK;  // k[:, :, ::-1]
  a.k.stride[kHead] = -DQK;
  a.o.data = o_buf.data() + (B - 1) * SQ * H * DV + (SQ - 1) * H * DV;  // o[::-1, ::-1]
  a.o.stride[kBatch] = -SQ * H * DV;
  a.o.stride[kSeq] = -H * DV;
  a.lse.data = lse_buf.data() + SQ - 1;
  a.lse.stride[2] = -1;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  BackwardArgs b = bwd();
  b.dk.data = dk_buf.data() + (SKV - 1) * HG * DQK;
  b.dk.stride[kSeq] = -HG * DQK;
  EXPECT_TRUE(check(b).ok()) << check(b).message();
  // A reversed output still may not overlap an input: o walks back from q's end into q.
  // o[:, ::-1] placed so that its lowest element, (b 0, s 7, h 0, d 0), is q's last one.
  a = fwd();
  a.o.data = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(q_buf.data()) +  // past q's end
                                     2 * ((q_buf.size() - 1) + (SQ - 1) * H * DV));
  a.o.stride[kSeq] = -H * DV;
  EXPECT_INVALID(check(a), "o overlaps q in memory", "o data + -448 bytes is q data + 2046 bytes");
  // A reversed output overlapping itself (seq stride -4 with 8-wide rows).
  a = fwd();
  a.o.data = o_buf.data() + 64;
  a.o.stride = {0, -4, 0, 1};
  a.o.shape = {1, 4, 1, DV};
  a.q.shape = {1, 4, 1, DQK};
  a.k.shape = {1, SKV, 1, DQK};
  a.v.shape = {1, SKV, 1, DV};
  a.lse = {};
  EXPECT_INVALID(check(a), "o overlaps itself");
}

TEST_F(Validate, NegativeStridesMayNotReachBelowAddressZero) {
  ForwardArgs a = fwd();
  a.q.data = reinterpret_cast<void*>(std::uintptr_t{64});
  a.q.stride[kSeq] = -H * DQK;  // seq 7 sits 7 * 64 elements below address 64
  EXPECT_INVALID(check(a), "q: negative strides reach 896 bytes below the data pointer");
  a = fwd();
  a.k.stride[kBatch] = std::numeric_limits<std::int64_t>::min() / 2;
  EXPECT_INVALID(check(a), "k: view extent overflows int64", "batch extent 2");
}

TEST_F(Validate, HeadDimOfOneMayCarryAnyStride) {
  ForwardArgs a = fwd();
  for (TensorView* t : {&a.q, &a.k}) {
    t->shape[kHeadDim] = 1;
    t->stride[kHeadDim] = 5;
  }
  a.q.stride[kHeadDim] = -3;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  a.v.stride[kHeadDim] = 2;  // d_v = 8 > 1: still refused
  EXPECT_INVALID(check(a), "v: head-dim stride is 2");
}

TEST_F(Validate, SizeOneDimsMayCarryAnyStride) {
  ForwardArgs a = fwd();
  a.q.shape[kBatch] = a.k.shape[kBatch] = a.v.shape[kBatch] = a.o.shape[kBatch] = 1;
  a.lse.shape[0] = 1;
  a.q.stride[kBatch] = -7;
  a.k.stride[kBatch] = std::numeric_limits<std::int64_t>::max();
  a.v.stride[kBatch] = 0;
  a.o.stride[kBatch] = 123456789;
  a.lse.stride[0] = -1;
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

TEST_F(Validate, BatchMismatch) {
  ForwardArgs a = fwd();
  a.k.shape[kBatch] = 3;
  EXPECT_INVALID(check(a), "k: batch extent 3 differs from q's 2");
}

TEST_F(Validate, SeqKvMismatchBetweenKAndV) {
  ForwardArgs a = fwd();
  a.v.shape[kSeq] = 5;
  EXPECT_INVALID(check(a), "v: seq extent 5 differs from k's 6");
}

TEST_F(Validate, HeadDimQkMismatch) {
  ForwardArgs a = fwd();
  a.k.shape[kHeadDim] = 8;
  a.k.stride = {SKV * HG * 8, HG * 8, 8, 1};
  EXPECT_INVALID(check(a), "k: head-dim extent 8 differs from q's 16");
}

TEST_F(Validate, KvHeadsMismatchBetweenKAndV) {
  ForwardArgs a = fwd();
  a.v.shape[kHead] = 1;
  EXPECT_INVALID(check(a), "v: head extent 1 differs from k's 2");
}

TEST_F(Validate, OutputShapeMismatch) {
  ForwardArgs a = fwd();
  a.o.shape[kHeadDim] = 4;
  EXPECT_INVALID(check(a), "o: head-dim extent 4 differs from v's 8");
  a = fwd();
  a.o.shape[kSeq] = 7;
  EXPECT_INVALID(check(a), "o: seq extent 7 differs from q's 8");
  a = fwd();
  a.o.shape[kHead] = 2;
  EXPECT_INVALID(check(a), "o: head extent 2 differs from q's 4");
}

TEST_F(Validate, HeadsNotMultipleOfKvHeads) {
  ForwardArgs a = fwd();
  a.k.shape[kHead] = a.v.shape[kHead] = 3;
  EXPECT_INVALID(check(a), "heads 4 is not a multiple of kv_heads 3");
}

TEST_F(Validate, GradientShapesMatchTheirTensors) {
  BackwardArgs a = bwd();
  a.dq.shape[kSeq] = 4;
  EXPECT_INVALID(check(a), "dq: seq extent 4 differs from q's 8");
  a = bwd();
  a.dk.shape[kHead] = 1;
  EXPECT_INVALID(check(a), "dk: head extent 1 differs from k's 2");
  a = bwd();
  a.dv.shape[kHeadDim] = 4;
  EXPECT_INVALID(check(a), "dv: head-dim extent 4 differs from v's 8");
  a = bwd();
  a.d_o.shape[kBatch] = 1;
  EXPECT_INVALID(check(a), "dO: batch extent 1 differs from o's 2");
}

TEST_F(Validate, DtypeMismatch) {
  ForwardArgs a = fwd();
  a.v.dtype = DType::bf16;
  EXPECT_INVALID(check(a), "v: dtype bf16 differs from q's f16");
  BackwardArgs b = bwd();
  b.dk.dtype = DType::f32;
  EXPECT_INVALID(check(b), "dk: dtype f32 differs from q's f16");
}

TEST_F(Validate, UnknownDtypeValue) {
  ForwardArgs a = fwd();
  a.k.dtype = static_cast<DType>(7);
  EXPECT_INVALID(check(a), "k: dtype 7 is unknown");
}

TEST_F(Validate, NullPointerWithNonZeroSize) {
  ForwardArgs a = fwd();
  a.v.data = nullptr;
  EXPECT_INVALID(check(a), "v: data is null", "[2, 6, 2, 8]");
  BackwardArgs b = bwd();
  b.d_o.data = nullptr;
  EXPECT_INVALID(check(b), "dO: data is null");
}

TEST_F(Validate, WindowBelowMinusOne) {
  ForwardArgs a = fwd();
  a.options.window.left = -2;
  EXPECT_INVALID(check(a), "window left is -2", "-1 (unbounded) or >= 0");
  a = fwd();
  a.options.window.right = -5;
  EXPECT_INVALID(check(a), "window right is -5");
}

// A window near INT64_MAX used to overflow i + s_kv - s_q + right + 1 in the shared mask
// math, so every backend (the reference included) silently masked every key.
TEST_F(Validate, UnknownEnumValuesAreRefused) {
  ForwardArgs a = fwd();
  a.memory = static_cast<Memory>(42);
  EXPECT_INVALID(check(a), "memory 42 is unknown", "host, device");
  a = fwd();
  a.backend = static_cast<Backend>(42);
  const Status s = strideattn::forward(a);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  EXPECT_NE(s.message().find("backend 42 is unknown"), std::string::npos) << s.message();
}

TEST_F(Validate, WindowTooLargeForMaskArithmetic) {
  ForwardArgs a = fwd();
  a.options.window.right = std::numeric_limits<std::int64_t>::max();
  EXPECT_INVALID(check(a), "window right is 9223372036854775807", "-1 (unbounded)");
  a = fwd();
  a.options.window.left = std::numeric_limits<std::int64_t>::max();
  EXPECT_INVALID(check(a), "window left is 9223372036854775807");
  BackwardArgs b = bwd();
  b.options.window = {.left = (std::int64_t{1} << 62) + 1, .right = 0};
  EXPECT_INVALID(check(b), "window left is 4611686018427387905");
  a = fwd();
  a.options.window = {.left = std::int64_t{1} << 62, .right = std::int64_t{1} << 62};  // the cap itself
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

// An f16 view at an odd address was accepted; the backends read it through uint16_t pointers.
TEST_F(Validate, DataPointerMustBeElementAligned) {
  ForwardArgs a = fwd();
  a.q.data = reinterpret_cast<char*>(q_buf.data()) + 1;
  a.q.shape[kBatch] = 1;  // stay inside the buffer
  EXPECT_INVALID(check(a), "q: data pointer is 1 bytes past a 2-byte boundary");
  a = fwd();
  a.lse.data = reinterpret_cast<float*>(reinterpret_cast<char*>(lse_buf.data()) + 2);
  a.lse.shape[0] = 1;
  EXPECT_INVALID(check(a), "lse: data pointer is 2 bytes past a 4-byte boundary");
  BackwardArgs b = bwd();
  b.dv.data = reinterpret_cast<char*>(dv_buf.data()) + 1;
  b.dv.shape[kBatch] = 1;
  b.v.shape[kBatch] = 1;
  EXPECT_INVALID(check(b), "data pointer is 1 bytes past a 2-byte boundary");
  a = fwd();
  a.q.data = reinterpret_cast<char*>(q_buf.data()) + 1;
  a.q.shape[kBatch] = 0;  // an empty view is never read: any pointer
  a.k.shape[kBatch] = a.v.shape[kBatch] = a.o.shape[kBatch] = 0;
  a.lse = {};
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

TEST_F(Validate, ScaleMustBeFinitePositive) {
  ForwardArgs a = fwd();
  a.options.scale = 0.0;
  EXPECT_INVALID(check(a), "scale is 0", "finite value > 0");
  a.options.scale = -0.5;
  EXPECT_INVALID(check(a), "scale is -0.5");
  a.options.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_INVALID(check(a), "scale is nan");
  a.options.scale = std::numeric_limits<double>::infinity();
  EXPECT_INVALID(check(a), "scale is inf");
  // Outside the normal fp32 range: rounds to inf, or to a subnormal / zero, in fp32.
  a.options.scale = 1e39;
  EXPECT_INVALID(check(a), "scale is 1e+39", "normal fp32");
  a.options.scale = static_cast<double>(std::numeric_limits<float>::max()) * (1 + 1e-15);
  EXPECT_INVALID(check(a), "scale is 3.40282346638529");
  a.options.scale = 1e-39;
  EXPECT_INVALID(check(a), "scale is 1e-39");
  a.options.scale = 5e-324;
  EXPECT_INVALID(check(a), "scale is 5e-324");
  // The ends of the range are accepted.
  for (float ok : {std::numeric_limits<float>::min(), std::numeric_limits<float>::max()}) {
    a.options.scale = static_cast<double>(ok);
    EXPECT_TRUE(check(a).ok()) << check(a).message();
  }
}

TEST_F(Validate, UnknownMaskKind) {
  ForwardArgs a = fwd();
  a.options.mask = static_cast<MaskKind>(9);
  EXPECT_INVALID(check(a), "mask kind 9 is unknown");
}

TEST_F(Validate, LargeHeadDimIsNotAValidationError) {
  std::vector<std::uint16_t> q(1 * 2 * 1 * 576), k(1 * 2 * 1 * 576), v(1 * 2 * 1 * 576), o(1 * 2 * 1 * 576);
  ForwardArgs a;
  a.q = bshd(q.data(), 1, 2, 1, 576);
  a.k = bshd(k.data(), 1, 2, 1, 576);
  a.v = bshd(v.data(), 1, 2, 1, 576);
  a.o = bshd(o.data(), 1, 2, 1, 576);
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

TEST_F(Validate, ExtentOverflowsInt64) {
  ForwardArgs a = fwd();
  a.q.stride[kSeq] = std::int64_t{1} << 61;
  EXPECT_INVALID(check(a), "q: view extent overflows int64", "seq extent 8");
  a = fwd();
  a.k.shape[kSeq] = a.v.shape[kSeq] = std::numeric_limits<std::int64_t>::max();
  EXPECT_INVALID(check(a), "k: view extent overflows int64");
}

TEST_F(Validate, BackwardRequiresLse) {
  BackwardArgs a = bwd();
  a.lse.data = nullptr;
  EXPECT_INVALID(check(a), "lse: data is null", "backward needs");
}

TEST_F(Validate, LseShape) {
  ForwardArgs a = fwd();
  a.lse.shape = {B, H, SQ - 1};
  EXPECT_INVALID(check(a), "lse: shape [2, 4, 7]", "[2, 4, 8]");
  BackwardArgs b = bwd();
  b.lse.shape = {B, SQ, H};
  EXPECT_INVALID(check(b), "lse: shape [2, 8, 4]");
}

// ---------------------------------------------------------------- overlap rules

TEST_F(Validate, OutputOverlapsInput) {
  ForwardArgs a = fwd();
  // o placed inside q's buffer (same size in bytes at least)
  a.o.data = q_buf.data() + 512;
  EXPECT_INVALID(check(a), "o overlaps q in memory", "o data + 0 bytes is q data + 1024 bytes");
}

TEST_F(Validate, LseOverlapsOutput) {
  ForwardArgs a = fwd();
  a.lse.data = reinterpret_cast<float*>(o_buf.data() + 8);  // inside o
  EXPECT_INVALID(check(a), "o overlaps lse in memory", "o data + 16 bytes is lse data + 0 bytes");
  BackwardArgs b = bwd();
  b.lse.data = reinterpret_cast<float*>(dq_buf.data() + 4);  // dq written over the LSE it reads
  EXPECT_INVALID(check(b), "dq overlaps lse in memory", "dq data + 8 bytes is lse data + 0 bytes");
}

TEST_F(Validate, GradientsOverlapEachOther) {
  BackwardArgs a = bwd();
  a.dv.data = dk_buf.data() + 16;  // dv inside dk
  EXPECT_INVALID(check(a), "dk overlaps dv in memory");
}

TEST_F(Validate, GradientOverlapsInput) {
  BackwardArgs a = bwd();
  a.dq.data = do_buf.data();  // do_buf is smaller than dq: only part overlaps
  EXPECT_INVALID(check(a), "dq overlaps");
}

TEST_F(Validate, OutputOverlapsItself) {
  ForwardArgs a = fwd();
  a.o.stride[kSeq] = 0;  // every s row writes the same memory
  EXPECT_INVALID(check(a), "o overlaps itself");
  a = fwd();
  a.o.stride = {SQ * H * DV, H * DV, 4, 1};  // heads 4 apart but 8 wide: partial overlap
  EXPECT_INVALID(check(a), "o overlaps itself");
}

TEST_F(Validate, InputsMayShareMemory) {
  // q, k, v may alias each other freely (self-attention on one tensor).
  ForwardArgs a = fwd();
  a.k = bshd(q_buf.data(), B, SQ, H, DQK);
  a.v = bshd(q_buf.data(), B, SQ, H, DQK);
  a.o = bshd(o_buf.data(), B, SQ, H, DQK);
  std::vector<std::uint16_t> big(B * SQ * H * DQK);
  a.o.data = big.data();
  EXPECT_TRUE(check(a).ok()) << check(a).message();
}

TEST_F(Validate, InterleavedOutputsInOneBufferAreFine) {
  // o and lse are separate; dq/dk/dv interleaved in one dqkv buffer (sbh3d-like) never
  // share an element although their bounding boxes coincide.
  BackwardArgs a = bwd();
  const std::int64_t b = 2, s = 8, h = 2, d = 16;
  std::vector<std::uint16_t> qkv(s * b * h * 3 * d), dqkv(s * b * h * 3 * d);
  std::vector<std::uint16_t> o(b * s * h * d), dout(b * s * h * d);
  std::vector<float> lse(b * h * s);
  auto packed = [&](std::uint16_t* base, int which) {
    TensorView v;
    v.data = base + which * d;
    v.shape = {b, s, h, d};
    v.stride = {h * 3 * d, b * h * 3 * d, 3 * d, 1};
    return v;
  };
  a.q = packed(qkv.data(), 0);
  a.k = packed(qkv.data(), 1);
  a.v = packed(qkv.data(), 2);
  a.dq = packed(dqkv.data(), 0);
  a.dk = packed(dqkv.data(), 1);
  a.dv = packed(dqkv.data(), 2);
  a.o = bshd(o.data(), b, s, h, d);
  a.d_o = bshd(dout.data(), b, s, h, d);
  a.lse.data = lse.data();
  a.lse.shape = {b, h, s};
  a.lse.stride = {h * s, s, 1};
  EXPECT_TRUE(check(a).ok()) << check(a).message();
  // ... but dk shifted by one element into dq's territory is caught.
  a.dk.data = dqkv.data() + d - 1;
  EXPECT_INVALID(check(a), "dq overlaps dk in memory");
}

// ---------------------------------------------------------------- varlen rules

struct VarlenFixture : ::testing::Test {
  static constexpr std::int64_t H = 2, D = 8, TQ = 12, TKV = 10;
  std::vector<std::uint16_t> q = std::vector<std::uint16_t>(TQ * H * D), k = std::vector<std::uint16_t>(TKV * H * D),
                             v = std::vector<std::uint16_t>(TKV * H * D), o = std::vector<std::uint16_t>(TQ * H * D);
  std::vector<float> lse = std::vector<float>(H * TQ);
  ForwardArgs fwd() {
    ForwardArgs a;
    a.q = bshd(q.data(), 1, TQ, H, D);
    a.k = bshd(k.data(), 1, TKV, H, D);
    a.v = bshd(v.data(), 1, TKV, H, D);
    a.o = bshd(o.data(), 1, TQ, H, D);
    a.lse.data = lse.data();
    a.lse.shape = {1, H, TQ};
    a.lse.stride = {H * TQ, TQ, 1};
    a.varlen.seqlens_q = {5, 0, 4};
    a.varlen.seqlens_kv = {3, 2, 4};
    a.varlen.offsets_q = {0, 5, 7};  // padding: tokens 5..6 and 11
    return a;
  }
};
using Varlen = VarlenFixture;

TEST_F(Varlen, ValidPasses) { EXPECT_TRUE(check(fwd()).ok()) << check(fwd()).message(); }

TEST_F(Varlen, BothSidesWithEqualCounts) {
  ForwardArgs a = fwd();
  a.varlen.seqlens_kv = {3, 2};
  EXPECT_INVALID(check(a), "seqlens_q has 3 sequences but seqlens_kv has 2");
  a = fwd();
  a.varlen.seqlens_kv.clear();
  EXPECT_INVALID(check(a), "seqlens_kv has 0");
}

TEST_F(Varlen, OffsetsCount) {
  ForwardArgs a = fwd();
  a.varlen.offsets_kv = {0, 3};
  EXPECT_INVALID(check(a), "offsets_kv has 2 entries but seqlens_kv has 3");
}

TEST_F(Varlen, NegativeLengthOrOffset) {
  ForwardArgs a = fwd();
  a.varlen.seqlens_q[1] = -4;
  EXPECT_INVALID(check(a), "seqlens_q[1] is -4");
  a = fwd();
  a.varlen.offsets_q[2] = -1;
  EXPECT_INVALID(check(a), "offsets_q[2] is -1");
}

TEST_F(Varlen, SequenceRunsPastTokens) {
  ForwardArgs a = fwd();
  a.varlen.offsets_q = {0, 5, 9};
  EXPECT_INVALID(check(a), "q: sequence 2 runs to token 13 but q has 12 tokens");
  a = fwd();
  a.varlen.seqlens_kv = {3, 2, 6};  // packed: 11 > 10
  EXPECT_INVALID(check(a), "k: sequence 2 runs to token 11 but k has 10 tokens");
  a = fwd();
  a.varlen.offsets_q = {0, 5, std::numeric_limits<std::int64_t>::max()};  // no overflow crash
  EXPECT_INVALID(check(a), "q: sequence 2 runs to token");
}

TEST_F(Varlen, SequencesMustNotOverlap) {
  ForwardArgs a = fwd();
  a.varlen.offsets_q = {0, 5, 3};
  EXPECT_INVALID(check(a), "q sequences 0 and 2 overlap", "[0, 5)", "[3, 7)");
}

TEST_F(Varlen, ViewsNeedBatchOne) {
  ForwardArgs a = fwd();
  a.k.shape[kBatch] = a.v.shape[kBatch] = a.q.shape[kBatch] = a.o.shape[kBatch] = 2;
  a.q.shape[kSeq] = a.o.shape[kSeq] = 6;
  a.k.shape[kSeq] = a.v.shape[kSeq] = 5;
  EXPECT_INVALID(check(a), "q: batch extent is 2 in a varlen problem");
}

TEST_F(Varlen, LseShapeIsTokens) {
  ForwardArgs a = fwd();
  a.lse.shape = {3, H, 5};
  EXPECT_INVALID(check(a), "lse: shape [3, 2, 5]", "[1, h, tokens_q] = [1, 2, 12]");
}

// ---------------------------------------------------------------- cu_seqlens arrays

struct CuSeqlensFixture : VarlenFixture {
  std::vector<std::int32_t> cu_q{0, 5, 5, 9}, cu_kv{0, 3, 5, 9};
  ForwardArgs cu() {
    ForwardArgs a = fwd();
    a.varlen = {};
    a.varlen.count = 3;
    a.varlen.cu_seqlens_q = cu_q.data();
    a.varlen.cu_seqlens_kv = cu_kv.data();
    a.varlen.max_seqlen_q = 5;
    a.varlen.max_seqlen_kv = 4;
    return a;
  }
};
using CuSeqlens = CuSeqlensFixture;

TEST_F(CuSeqlens, ValidPassesWithTheBoundsAsTheSizes) {
  Problem p;
  ASSERT_TRUE(make_problem(cu(), &p).ok());
  EXPECT_TRUE(p.varlen && p.cu_seqlens);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.s_q, 5);
  EXPECT_EQ(p.s_kv, 4);
  EXPECT_FALSE(p.lengths_known()) << "the arrays are not read when the problem is made";
}

TEST_F(CuSeqlens, OneFormOnly) {
  ForwardArgs a = cu();
  a.varlen.seqlens_q = {5, 0, 4};
  a.varlen.seqlens_kv = {3, 2, 4};
  EXPECT_INVALID(check(a), "both forms are given");
}

TEST_F(CuSeqlens, ArraysWithoutCount) {
  ForwardArgs a = cu();
  a.varlen.count = 0;
  EXPECT_INVALID(check(a), "cu_seqlens arrays or max_seqlen bounds are set but count is 0");
  a = fwd();
  a.varlen = {};
  a.varlen.max_seqlen_q = 4;
  EXPECT_INVALID(check(a), "but count is 0");
}

TEST_F(CuSeqlens, CountRange) {
  ForwardArgs a = cu();
  a.varlen.count = -2;
  EXPECT_INVALID(check(a), "count is -2; supported: 1 to 2147483646");
  a.varlen.count = std::int64_t(1) << 31;
  EXPECT_INVALID(check(a), "count is 2147483648");
}

TEST_F(CuSeqlens, BoundsWithinTheViews) {
  ForwardArgs a = cu();
  a.varlen.max_seqlen_q = 13;
  EXPECT_INVALID(check(a), "max_seqlen_q is 13; supported: 0 to the 12 tokens of q");
  a = cu();
  a.varlen.max_seqlen_kv = -1;
  EXPECT_INVALID(check(a), "max_seqlen_kv is -1");
}

TEST_F(CuSeqlens, ArraysPresentAndAligned) {
  ForwardArgs a = cu();
  a.varlen.cu_seqlens_q = nullptr;
  EXPECT_INVALID(check(a), "count is 3 but cu_seqlens_q is null");
  a = cu();
  a.varlen.seq_offsets_kv = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(cu_kv.data()) + 1);
  EXPECT_INVALID(check(a), "seq_offsets_kv is 1 bytes past a 4-byte boundary");
  // A plan's problem: the arrays come with each run.
  a = cu();
  a.varlen.cu_seqlens_q = a.varlen.cu_seqlens_kv = nullptr;
  Problem p;
  EXPECT_TRUE(make_problem(a, &p, Pointers::deferred).ok());
}

TEST_F(CuSeqlens, ViewsNeedBatchOne) {
  ForwardArgs a = cu();
  a.k.shape[kBatch] = a.v.shape[kBatch] = a.q.shape[kBatch] = a.o.shape[kBatch] = 2;
  a.q.shape[kSeq] = a.o.shape[kSeq] = 6;
  a.k.shape[kSeq] = a.v.shape[kSeq] = 5;
  a.lse = {};
  EXPECT_INVALID(check(a), "q: batch extent is 2 in a varlen problem");
}

// ---------------------------------------------------------------- pointers given at run time

TEST_F(Fixture, DeferredPointersAreNotRequiredButEverythingElseIsChecked) {
  ForwardArgs a = fwd();
  a.q.data = a.k.data = a.v.data = a.o.data = nullptr;
  a.lse.data = nullptr;
  Problem p;
  ASSERT_TRUE(make_problem(a, &p, Pointers::deferred).ok());
  EXPECT_TRUE(p.writes_lse()) << "an LSE shape requests LSE";
  EXPECT_INVALID(check(a), "q: data is null");  // a call needs them
  a.lse = {};
  ASSERT_TRUE(make_problem(a, &p, Pointers::deferred).ok());
  EXPECT_FALSE(p.writes_lse());
  a = fwd();
  a.q.data = nullptr;
  a.k.stride[kHeadDim] = 2;
  EXPECT_INVALID(make_problem(a, &p, Pointers::deferred), "k: head-dim stride is 2");
  // An output given with a pointer is still checked against the inputs given with one.
  a = fwd();
  a.q.data = nullptr;
  a.o = bshd(k_buf.data(), B, SQ, H, DV);  // (validation reads no element)
  EXPECT_INVALID(make_problem(a, &p, Pointers::deferred), "o overlaps k in memory");
  BackwardArgs b = bwd();
  b.lse = {};
  EXPECT_INVALID(make_problem(b, &p, Pointers::deferred), "lse: shape [0, 0, 0] differs from [b, h, s_q]");
}

TEST(ValidateGarbage, NeverCrashes) {
  // Garbage of every kind must give a status, not a crash. Deterministic pseudo-random sweep.
  std::uint64_t x = 88172645463325252ull;
  auto next = [&]() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const std::int64_t picks[] = {
      0, 1, 2, -1, 7, 64, 1 << 20, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()};
  int invalid = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    BackwardArgs a;
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.o, &a.d_o, &a.dq, &a.dk, &a.dv}) {
      t->data = reinterpret_cast<void*>(next() % 3 == 0 ? 0 : (next() & ~std::uint64_t{7}));
      t->dtype = static_cast<DType>(next() % 4);
      for (int i = 0; i < 4; ++i) {
        t->shape[i] = picks[next() % 9];
        t->stride[i] = picks[next() % 9];
      }
    }
    a.lse.data = reinterpret_cast<float*>(next() & ~std::uint64_t{7});
    for (int i = 0; i < 3; ++i) {
      a.lse.shape[i] = picks[next() % 9];
      a.lse.stride[i] = picks[next() % 9];
    }
    if (next() % 2) {
      a.varlen.seqlens_q = {picks[next() % 9], picks[next() % 9]};
      a.varlen.seqlens_kv = {picks[next() % 9]};
      if (next() % 2) a.varlen.seqlens_kv.push_back(picks[next() % 9]);
      if (next() % 2) a.varlen.offsets_q = {picks[next() % 9], picks[next() % 9]};
    }
    a.options.window = {picks[next() % 9], picks[next() % 9]};
    a.options.scale = double(picks[next() % 9]);
    const Status s = check(a);
    if (s.code() == StatusCode::invalid_argument) ++invalid;
    EXPECT_FALSE(s.message().empty() && !s.ok());
  }
  EXPECT_GT(invalid, 1900);
}

}  // namespace
}  // namespace strideattn::detail
