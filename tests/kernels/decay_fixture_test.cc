// The decay family on the CPU backend against the golden ops fixtures, through
// kernels/verify_ops.h (the engine of `lair verify ops`): both forward forms
// (output, final state) and every gradient, at the README tolerances, for the
// default and a smaller chunk size, and with BF16 activations; and the
// engine's own behaviour (the rounding floor, a missing fixture).
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/verify_ops.h"
#include "tests/support/fixtures.h"

namespace lair::kernels {
namespace {

class DecayFixtureTest : public ::testing::TestWithParam<const char*> {};

void ExpectOpPasses(const std::string& dir, const std::string& name,
                    const VerifyOpsOptions& options, size_t expected_checks) {
  absl::StatusOr<std::vector<OpSpec>> manifest = ReadOpsManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const OpSpec* spec = nullptr;
  for (const OpSpec& s : *manifest) {
    if (s.name == name) spec = &s;
  }
  ASSERT_NE(spec, nullptr) << name << " is not in the manifest";
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  const OpReport report = VerifyOp(*backend, dir, *spec, options);
  ASSERT_TRUE(report.status.ok()) << report.status;
  EXPECT_EQ(report.checks.size(), expected_checks);
  for (const TensorCheck& check : report.checks) {
    EXPECT_LE(check.relative_error, check.tolerance) << check.label;
  }
  EXPECT_TRUE(report.passed());
}

// o and ht for two forms, then dq, dk, dv, dh0 and the gate gradients held.
size_t ExpectedChecks(const std::string& name) {
  if (name == "scalar_decay" || name == "vector_decay") return 4 + 5;
  if (name == "left_right_decay") return 4 + 6;
  return 4 + 4;
}

TEST_P(DecayFixtureTest, MatchesAtChunkSize64) {
  LAIR_FIXTURE_OR_SKIP(manifest, "ops/manifest.json");
  ExpectOpPasses(::lair::testing::FixturesDir() + "/ops", GetParam(), VerifyOpsOptions{},
                 ExpectedChecks(GetParam()));
}

TEST_P(DecayFixtureTest, MatchesAtChunkSize16) {
  LAIR_FIXTURE_OR_SKIP(manifest, "ops/manifest.json");
  VerifyOpsOptions options;
  options.chunk_size = 16;
  ExpectOpPasses(::lair::testing::FixturesDir() + "/ops", GetParam(), options,
                 ExpectedChecks(GetParam()));
}

TEST_P(DecayFixtureTest, MatchesWithBf16Activations) {
  LAIR_FIXTURE_OR_SKIP(manifest, "ops/manifest.json");
  VerifyOpsOptions options;
  options.dtype = DType::kBF16;
  ExpectOpPasses(::lair::testing::FixturesDir() + "/ops", GetParam(), options,
                 ExpectedChecks(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Ops, DecayFixtureTest,
                         ::testing::Values("linear_attn", "constant_decay", "scalar_decay",
                                           "vector_decay", "left_right_decay"));

// The rounding floor: the exact computation on bf16-rounded inputs. For the
// decay ops it is well inside the tolerance and the CPU's bf16 run sits on
// it; mlstm_exp's dq and dk are so sensitive to q and k that rounding them
// alone reaches the 5e-2 gradient tolerance (5.0e-2 and 5.3e-2; a float64
// computation on the same rounded inputs gives the same), so a bf16 run is
// judged against the exact result on its inputs there.
TEST(VerifyOpsTest, RoundingFloorSeparatesInputRoundingFromKernelError) {
  LAIR_FIXTURE_OR_SKIP(manifest, "ops/manifest.json");
  const std::string dir = ::lair::testing::FixturesDir() + "/ops";
  absl::StatusOr<std::vector<OpSpec>> ops = ReadOpsManifest(dir);
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  VerifyOpsOptions bf16;
  bf16.dtype = DType::kBF16;
  for (const OpSpec& spec : *ops) {
    if (spec.name == "vector_decay") {
      OpReport report = VerifyOp(*cpu, dir, spec, bf16);
      AddRoundingFloor(*cpu, dir, bf16, report);
      ASSERT_TRUE(report.status.ok()) << report.status;
      for (const TensorCheck& c : report.checks) {
        EXPECT_GT(c.floor, 0) << c.label;
        EXPECT_LT(c.floor, c.tolerance) << c.label;
        EXPECT_LT(c.own_error, 1e-2) << c.label;  // the output's own bf16 rounding
      }
    }
    if (spec.name == "mlstm_exp") {
      VerifyOpsOptions rounded = bf16;
      rounded.rounded_in_f32 = true;
      const OpReport floor = VerifyOp(*cpu, dir, spec, rounded);
      ASSERT_TRUE(floor.status.ok()) << floor.status;
      for (const TensorCheck& c : floor.checks) {
        if (c.label == "backward dq" || c.label == "backward dk") {
          EXPECT_GT(c.relative_error, 0.9 * c.tolerance) << c.label;
          EXPECT_LT(c.relative_error, 6e-2) << c.label;
        } else {
          EXPECT_LE(c.relative_error, c.tolerance) << c.label;
        }
      }
    }
  }
  // A check passes at the floor only when the floor misses and ours is
  // within tolerance of the exact result on the rounded inputs.
  TensorCheck c;
  c.label = "backward dk";
  c.relative_error = 0.053;
  c.tolerance = 0.05;
  EXPECT_FALSE(c.passed());
  c.floor = 0.0528;
  c.own_error = 0.002;
  EXPECT_TRUE(c.at_floor());
  EXPECT_TRUE(c.passed());
  c.own_error = 0.06;
  EXPECT_FALSE(c.passed());
  c.own_error = 0.002;
  c.floor = 0.02;  // under half the tolerance: the reference decides
  EXPECT_FALSE(c.passed());
}

TEST(VerifyOpsTest, ReportsAMissingFixtureWithoutCrashing) {
  LAIR_FIXTURE_OR_SKIP(manifest, "ops/manifest.json");
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const OpReport report =
      VerifyOp(*backend, ::lair::testing::FixturesDir() + "/ops",
               OpSpec{"no_such_op", "vector_decay", 0.125f, 1e-6f}, VerifyOpsOptions{});
  EXPECT_FALSE(report.status.ok());
  EXPECT_FALSE(report.passed());
}

}  // namespace
}  // namespace lair::kernels
