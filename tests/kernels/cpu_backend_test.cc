// CpuBackend: host memory operations, dtype conversion on upload, the device
// names MakeBackend accepts, and that the mixer entry points dispatch to the
// CPU kernels and refuse bad arguments.
#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/decay.h"

namespace lair::kernels {
namespace {

TEST(CpuBackendTest, AllocatesZeroedHostTensors) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  EXPECT_EQ(backend->device(), Device::kCpu);
  absl::StatusOr<Tensor> t = backend->Allocate(DType::kF32, {3, 5});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{3, 5}));
  for (int64_t e = 0; e < t->numel(); ++e) EXPECT_EQ(t->f32()[e], 0.0f);
  EXPECT_EQ(backend->Allocate(DType::kF32, {2, -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, UploadConvertsAndDownloadCopies) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const Tensor host = Tensor::FromFloats({4}, {1.0f, -2.5f, 0.1f, 3e5f});
  absl::StatusOr<Tensor> bf16 = backend->Upload(host, DType::kBF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->dtype(), DType::kBF16);
  absl::StatusOr<Tensor> back = backend->Download(*bf16);
  ASSERT_TRUE(back.ok());
  const Tensor f32 = back->ToF32();
  EXPECT_EQ(f32.f32()[0], 1.0f);
  EXPECT_EQ(f32.f32()[1], -2.5f);
  EXPECT_NEAR(f32.f32()[2], 0.1f, 1e-3f);
  EXPECT_NE(back->raw(), bf16->raw());

  // An upload is a copy: changing the host tensor afterwards changes nothing.
  absl::StatusOr<Tensor> same = backend->Upload(host, DType::kF32);
  ASSERT_TRUE(same.ok());
  host.f32()[0] = 7.0f;
  EXPECT_EQ(same->f32()[0], 1.0f);

  const Tensor ids = Tensor::Zeros(DType::kI32, {2});
  EXPECT_TRUE(backend->Upload(ids, DType::kI32).ok());
  EXPECT_EQ(backend->Upload(ids, DType::kF32).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, CopyChecksDtypeAndSize) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const Tensor src = Tensor::FromFloats({2, 2}, {1, 2, 3, 4});
  const Tensor dst = Tensor::Zeros(DType::kF32, {4});
  ASSERT_TRUE(backend->Copy(src, dst).ok());
  EXPECT_EQ(dst.f32()[3], 4.0f);
  EXPECT_EQ(backend->Copy(src, Tensor::Zeros(DType::kF32, {3})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->Copy(src, Tensor::Zeros(DType::kBF16, {4})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend->Synchronize().ok());
}

// A LinearGroup with a SiLU gate multiplies silu(gate) ∘ x, exactly as the
// Binary op forms it, and leaves x and the gate as they were.
TEST(CpuBackendTest, LinearGroupFormsTheSiluGate) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const Tensor x = Tensor::FromFloats({2, 3}, {1.0f, -2.0f, 0.5f, 3.0f, 0.25f, -1.5f});
  const Tensor gate = Tensor::FromFloats({2, 3}, {0.3f, 2.0f, -1.0f, -4.0f, 1.5f, 0.0f});
  const Tensor w = Tensor::FromFloats({4, 3}, {1, 2, 3, -1, 0, 1, 0.5f, 0.5f, 0.5f, 2, -2, 1});
  const Tensor weights[] = {w};
  const Tensor formed = Tensor::Zeros(DType::kF32, {2, 3});
  ASSERT_TRUE(backend->Binary({BinaryOp::kSiluMul, gate, x, formed}).ok());
  const Tensor want[] = {Tensor::Zeros(DType::kF32, {2, 4})};
  ASSERT_TRUE(backend->LinearGroup({formed, weights, {}, want}).ok());
  const Tensor got[] = {Tensor::Zeros(DType::kF32, {2, 4})};
  LinearGroupArgs args{x, weights, {}, got};
  args.silu_gate = gate;
  ASSERT_TRUE(backend->LinearGroup(args).ok());
  for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(got[0].f32()[e], want[0].f32()[e]) << e;
  EXPECT_EQ(x.f32()[1], -2.0f);
  EXPECT_EQ(gate.f32()[1], 2.0f);
}

// A LinearGroup with an input norm multiplies Norm(x), exactly as the Norm
// op forms it, and leaves x as it was.
TEST(CpuBackendTest, LinearGroupFormsTheInputNorm) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const Tensor x = Tensor::FromFloats({2, 4}, {1.0f, -2.0f, 0.5f, 3.0f, 0.25f, -1.5f, 2.0f, 0.0f});
  const Tensor w = Tensor::FromFloats({3, 4}, {1, 2, 3, 4, -1, 0, 1, 0.5f, 0.5f, 0.5f, 2, -2});
  const Tensor weights[] = {w};
  NormArgs norm;
  norm.kind = NormKind::kLayer;
  norm.eps = 1e-5f;
  norm.group_size = 2;
  norm.weight = Tensor::FromFloats({4}, {0.5f, 1.0f, -1.0f, 2.0f});
  NormArgs direct = norm;
  direct.x = x;
  direct.y = Tensor::Zeros(DType::kF32, {2, 4});
  ASSERT_TRUE(backend->Norm(direct).ok());
  const Tensor want[] = {Tensor::Zeros(DType::kF32, {2, 3})};
  ASSERT_TRUE(backend->LinearGroup({direct.y, weights, {}, want}).ok());
  const Tensor got[] = {Tensor::Zeros(DType::kF32, {2, 3})};
  LinearGroupArgs args{x, weights, {}, got};
  args.input_norm = norm;
  ASSERT_TRUE(backend->LinearGroup(args).ok());
  for (int64_t e = 0; e < 6; ++e) EXPECT_EQ(got[0].f32()[e], want[0].f32()[e]) << e;
  EXPECT_EQ(x.f32()[1], -2.0f);
}

// A weight of one group's length is shared by the groups: the norm equals
// the norm of the rows cut into one group each, and its weight gradient sums
// over the groups.
TEST(CpuBackendTest, NormSharesAGroupLengthWeight) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const Tensor x = Tensor::FromFloats({2, 4}, {1.0f, -2.0f, 0.5f, 3.0f, 0.25f, -1.5f, 2.0f, 0.0f});
  const Tensor gate = Tensor::FromFloats({2, 4}, {0.5f, 1, -1, 2, 0, 3, -0.5f, 1});
  const Tensor dy = Tensor::FromFloats({2, 4}, {1, -1, 0.5f, 2, -2, 0.25f, 1, 1});
  NormArgs shared;
  shared.kind = NormKind::kRms;
  shared.gate_mode = NormGate::kAfter;
  shared.eps = 1e-5f;
  shared.group_size = 2;
  shared.weight = Tensor::FromFloats({2}, {0.5f, -1.5f});
  shared.x = x;
  shared.gate = gate;
  shared.y = Tensor::Zeros(DType::kF32, {2, 4});
  ASSERT_TRUE(backend->Norm(shared).ok());
  NormArgs cut = shared;
  cut.group_size = 0;
  cut.x = x.Reshape({4, 2});
  cut.gate = gate.Reshape({4, 2});
  cut.y = Tensor::Zeros(DType::kF32, {4, 2});
  ASSERT_TRUE(backend->Norm(cut).ok());
  for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(shared.y.f32()[e], cut.y.f32()[e]) << e;

  NormBackwardArgs shared_b{shared, dy, Tensor::Zeros(DType::kF32, {2, 4}),
                            Tensor::Zeros(DType::kF32, {2}), Tensor::Zeros(DType::kF32, {2, 4})};
  ASSERT_TRUE(backend->NormBackward(shared_b).ok());
  NormBackwardArgs cut_b{cut, dy.Reshape({4, 2}), Tensor::Zeros(DType::kF32, {4, 2}),
                         Tensor::Zeros(DType::kF32, {2}), Tensor::Zeros(DType::kF32, {4, 2})};
  ASSERT_TRUE(backend->NormBackward(cut_b).ok());
  for (int64_t e = 0; e < 8; ++e) {
    EXPECT_EQ(shared_b.dx.f32()[e], cut_b.dx.f32()[e]) << e;
    EXPECT_EQ(shared_b.d_gate.f32()[e], cut_b.d_gate.f32()[e]) << e;
  }
  for (int64_t e = 0; e < 2; ++e) {
    EXPECT_FLOAT_EQ(shared_b.d_weight.f32()[e], cut_b.d_weight.f32()[e]) << e;
  }
}

TEST(CpuBackendTest, MakeBackendKnowsTheDeviceNames) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = MakeBackend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device(), Device::kCpu);
  EXPECT_EQ(MakeBackend("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeBackend("cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
#ifndef LAIR_HAVE_CUDA  // defined for every user of lair_kernels built with CUDA
  EXPECT_EQ(MakeBackend("cuda").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(MakeBackend("cuda:1").status().code(), absl::StatusCode::kUnimplemented);
#endif
}

// A one-head, one-dim decay problem small enough to check by hand:
// S_t = γ S_{t-1} + k_t v_t, o_t = scale·q_t S_t with γ = e^{-1}.
TEST(CpuBackendTest, DecayForwardDispatchesAndValidates) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  const std::vector<int32_t> cu = {0, 2}, slots = {1};
  SequenceBatch batch;
  batch.num_seqs = 1;
  batch.cu_seqlens = cu;
  batch.state_slot = slots;
  batch.max_seqlen = 2;
  DecayForwardArgs args;
  args.kind = DecayKind::kConstant;
  args.heads = args.key_dim = args.value_dim = 1;
  args.scale = 0.5f;
  args.q = Tensor::FromFloats({2, 1, 1}, {1, 2});
  args.k = Tensor::FromFloats({2, 1, 1}, {3, 4});
  args.v = Tensor::FromFloats({2, 1, 1}, {5, 6});
  args.log_gamma = Tensor::FromFloats({1}, {-1});
  args.o = Tensor::Zeros(DType::kF32, {2, 1, 1});
  args.state = Tensor::FromFloats({2, 1, 1, 1}, {100, 10});  // slot 1 holds S_0 = 10
  for (MixerForm form : {MixerForm::kChunked, MixerForm::kRecurrent}) {
    args.o = Tensor::Zeros(DType::kF32, {2, 1, 1});
    args.state = Tensor::FromFloats({2, 1, 1, 1}, {100, 10});
    ASSERT_TRUE(backend->DecayForward(batch, args, form).ok());
    const double g = std::exp(-1.0), s1 = g * 10 + 15, s2 = g * s1 + 24;
    EXPECT_NEAR(args.o.f32()[0], 0.5 * 1 * s1, 1e-4);
    EXPECT_NEAR(args.o.f32()[1], 0.5 * 2 * s2, 1e-4);
    EXPECT_NEAR(args.state.f32()[1], s2, 1e-4);
    EXPECT_EQ(args.state.f32()[0], 100.0f);  // another sequence's slot
  }
  const std::vector<int32_t> bad_slot = {2};
  batch.state_slot = bad_slot;
  const absl::Status status = backend->DecayForward(batch, args, MixerForm::kAuto);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("state_slot"), absl::string_view::npos);
}

}  // namespace
}  // namespace lair::kernels
