// The argument checks both backends share (kernels/dense_checks.h): the
// InvalidArgument "<Op>: <field>: <problem>" for each kind of bad input, and
// what a passing check derives.
#include "kernels/dense_checks.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace lair::kernels {
namespace {

Tensor F32(const Shape& shape) { return Tensor::Zeros(DType::kF32, shape); }

// a [3,5] times b [7,5] transposed into c [3,7].
GemmArgs Gemm(Tensor b) {
  GemmArgs args;
  args.a = F32({3, 5});
  args.b = std::move(b);
  args.c = F32({3, 7});
  return args;
}

void ExpectInvalid(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << status;
}

constexpr DType kCpuWeights[] = {DType::kF32};
constexpr DType kCudaWeights[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(DenseChecksTest, GemmDerivesItsSizes) {
  GemmArgs args = Gemm(F32({7, 5}));
  absl::StatusOr<GemmDims> dims = CheckGemmArgs(args, Device::kCpu, kCpuWeights);
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ(dims->m, 3);
  EXPECT_EQ(dims->n, 7);
  EXPECT_EQ(dims->k, 5);
}

TEST(DenseChecksTest, NamesTheDeviceTheBackendNeeds) {
  GemmArgs args = Gemm(F32({7, 5}));
  ExpectInvalid(CheckGemmArgs(args, Device::kCuda, kCudaWeights).status(),
                "Gemm: a: not a CUDA tensor");
  EmbeddingArgs embedding;
  embedding.ids = F32({2});
  embedding.out = F32({2, 4});
  ExpectInvalid(CheckEmbeddingArgs(embedding, Device::kCpu), "Embedding: table: missing tensor");
}

TEST(DenseChecksTest, GemmListsTheWeightDtypesOfTheBackend) {
  GemmArgs args = Gemm(Tensor::Zeros(DType::kBF16, {7, 5}));
  ExpectInvalid(CheckGemmArgs(args, Device::kCpu, kCpuWeights).status(),
                "Gemm: b: expected F32, got");
  args.b = Tensor::Zeros(DType::kI32, {7, 5});
  ExpectInvalid(CheckGemmArgs(args, Device::kCpu, kCudaWeights).status(),
                "Gemm: b: expected F32, BF16 or F16, got");
  args.b = F32({7, 4});
  ExpectInvalid(CheckGemmArgs(args, Device::kCpu, kCpuWeights).status(),
                "Gemm: b: inner dimension 4 differs from a's 5");
}

TEST(DenseChecksTest, LinearGroupIsOneGemmPerWeight) {
  const Tensor x = F32({3, 5});
  const Tensor weights[] = {F32({7, 5}), F32({2, 5})};
  const Tensor outs[] = {F32({3, 7}), F32({3, 2})};
  const Tensor biases[] = {Tensor(), F32({2})};
  const Activation activations[] = {{}, {UnaryOp::kSigmoid}};
  absl::StatusOr<std::vector<LinearProduct>> products =
      LinearGroupProducts({x, weights, biases, outs, activations}, Device::kCpu);
  ASSERT_TRUE(products.ok()) << products.status();
  ASSERT_EQ(products->size(), 2u);
  EXPECT_TRUE((*products)[1].gemm.trans_b);
  EXPECT_EQ((*products)[1].gemm.b.dim(0), 2);
  EXPECT_FALSE((*products)[0].gemm.bias.defined());
  EXPECT_TRUE((*products)[1].gemm.bias.defined());
  EXPECT_TRUE((*products)[0].activation.identity());
  EXPECT_EQ((*products)[1].activation.op, UnaryOp::kSigmoid);

  ExpectInvalid(LinearGroupProducts({x, {}, {}, {}}, Device::kCpu).status(),
                "LinearGroup: weights: empty");
  ExpectInvalid(LinearGroupProducts({x, weights, {}, {outs, 1}}, Device::kCpu).status(),
                "LinearGroup: outs: 1 for 2 weights");
  ExpectInvalid(LinearGroupProducts({x, weights, {biases, 1}, outs}, Device::kCpu).status(),
                "LinearGroup: biases: 1 for 2 weights");
  ExpectInvalid(
      LinearGroupProducts({x, weights, biases, outs, {activations, 1}}, Device::kCpu).status(),
      "LinearGroup: activations: 1 for 2 weights");

  // Residuals: one per weight, each undefined or of its output's shape.
  LinearGroupArgs with_residuals{x, weights, biases, outs};
  const Tensor residuals[] = {F32({3, 7}), Tensor()};
  with_residuals.residuals = residuals;
  products = LinearGroupProducts(with_residuals, Device::kCpu);
  ASSERT_TRUE(products.ok()) << products.status();
  EXPECT_TRUE((*products)[0].residual.defined());
  EXPECT_FALSE((*products)[1].residual.defined());
  with_residuals.residuals = {residuals, 1};
  ExpectInvalid(LinearGroupProducts(with_residuals, Device::kCpu).status(),
                "LinearGroup: residuals: 1 for 2 weights");
  const Tensor misshapen[] = {F32({3, 6}), Tensor()};
  with_residuals.residuals = misshapen;
  ExpectInvalid(LinearGroupProducts(with_residuals, Device::kCpu).status(),
                "LinearGroup: residuals[0]");

  // A SiLU gate has x's shape.
  LinearGroupArgs gated{x, weights, biases, outs};
  gated.silu_gate = F32({3, 5});
  EXPECT_TRUE(LinearGroupProducts(gated, Device::kCpu).ok());
  gated.silu_gate = F32({3, 4});
  ExpectInvalid(LinearGroupProducts(gated, Device::kCpu).status(), "LinearGroup: silu_gate");

  // An input norm is checked as a Norm of x, and not taken with a SiLU gate.
  LinearGroupArgs normed{x, weights, biases, outs};
  normed.input_norm.emplace().weight = F32({5});
  EXPECT_TRUE(LinearGroupProducts(normed, Device::kCpu).ok());
  normed.input_norm->group_size = 2;
  ExpectInvalid(LinearGroupProducts(normed, Device::kCpu).status(),
                "LinearGroup input_norm: group_size: 2 does not divide 5");
  normed.input_norm->group_size = 0;
  normed.input_norm->weight = F32({4});
  ExpectInvalid(LinearGroupProducts(normed, Device::kCpu).status(),
                "LinearGroup input_norm: weight");
  normed.input_norm->weight = Tensor();
  normed.silu_gate = F32({3, 5});
  ExpectInvalid(LinearGroupProducts(normed, Device::kCpu).status(),
                "LinearGroup: input_norm: cannot be set with silu_gate");
}

TEST(DenseChecksTest, SwiGluShapes) {
  SwiGluArgs args;
  args.x = F32({3, 4});
  args.w_gate = F32({6, 4});
  args.w_up = F32({6, 4});
  args.w_down = F32({5, 6});
  args.out = F32({3, 5});
  absl::StatusOr<int64_t> group = CheckSwiGluArgs(args, Device::kCpu);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(*group, 0);
  args.input_norm.emplace();
  group = CheckSwiGluArgs(args, Device::kCpu);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(*group, 4);
  args.w_up = F32({7, 4});
  ExpectInvalid(CheckSwiGluArgs(args, Device::kCpu).status(), "SwiGlu: w_up");
  args.w_up = F32({6, 4});
  args.w_down = F32({5, 7});
  ExpectInvalid(CheckSwiGluArgs(args, Device::kCpu).status(), "SwiGlu: w_down");
  args.w_down = F32({5, 6});
  args.residual = F32({3, 4});
  ExpectInvalid(CheckSwiGluArgs(args, Device::kCpu).status(), "SwiGlu: residual");
  args.residual = Tensor();
  args.out = F32({3, 6});
  ExpectInvalid(CheckSwiGluArgs(args, Device::kCpu).status(), "SwiGlu: out");
}

TEST(DenseChecksTest, BinaryBroadcastStrides) {
  BinaryArgs args;
  args.a = F32({2, 3});
  args.b = F32({1, 3});
  args.y = F32({2, 3});
  absl::StatusOr<BinaryStrides> strides = CheckBinaryArgs(args, Device::kCpu);
  ASSERT_TRUE(strides.ok()) << strides.status();
  EXPECT_EQ(strides->a, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(strides->b, (std::vector<int64_t>{0, 1}));
  args.b = F32({2, 2});
  ExpectInvalid(CheckBinaryArgs(args, Device::kCpu).status(),
                "Binary: b: [2, 2] does not broadcast to [2, 3]");
}

TEST(DenseChecksTest, NormGroupMustDivideTheColumns) {
  NormArgs args;
  args.x = F32({2, 6});
  args.y = F32({2, 6});
  args.group_size = 3;
  absl::StatusOr<int64_t> group = CheckNormArgs(args, Device::kCpu);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(*group, 3);
  args.group_size = 4;
  ExpectInvalid(CheckNormArgs(args, Device::kCpu).status(),
                "Norm: group_size: 4 does not divide 6");
}

// The weight spans the row or one group (shared by the groups).
TEST(DenseChecksTest, NormWeightSpansTheRowOrOneGroup) {
  NormArgs args;
  args.x = F32({2, 6});
  args.y = F32({2, 6});
  args.group_size = 3;
  for (int64_t n : {6, 3}) {
    args.weight = F32({n});
    EXPECT_TRUE(CheckNormArgs(args, Device::kCpu).ok()) << n;
  }
  args.weight = F32({2});
  ExpectInvalid(CheckNormArgs(args, Device::kCpu).status(),
                "Norm: weight: expected shape [6] or one group's [3], got [2]");
}

TEST(DenseChecksTest, AttentionChecksTheCacheRows) {
  const int32_t cu[] = {0, 3};
  const int32_t slots[] = {1};
  const int32_t starts[] = {2};
  SequenceBatch batch;
  batch.num_seqs = 1;
  batch.cu_seqlens = cu;
  batch.state_slot = slots;
  AttentionArgs args;
  args.heads = 2;
  args.kv_heads = 1;
  args.head_dim = 4;
  args.q = F32({3, 2, 4});
  args.k = F32({3, 1, 4});
  args.v = F32({3, 1, 4});
  args.o = F32({3, 2, 4});
  args.k_cache = F32({2, 5, 1, 4});
  args.v_cache = F32({2, 5, 1, 4});
  args.start_positions = starts;
  absl::StatusOr<int64_t> n = CheckAttentionArgs(batch, args, Device::kCpu);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3);
  args.k_cache = args.v_cache = F32({2, 4, 1, 4});
  ExpectInvalid(CheckAttentionArgs(batch, args, Device::kCpu).status(),
                "Attention: start_positions: sequence 0 would fill cache rows up to 5");
}

}  // namespace
}  // namespace lair::kernels
