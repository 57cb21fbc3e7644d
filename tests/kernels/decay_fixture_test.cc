// The decay family on the CPU backend against the golden ops fixtures, through
// kernels/verify_ops.h (the engine of `lair verify ops`): both forward forms
// (output, final state) and every gradient, at the README tolerances, for the
// default and a smaller chunk size, and with BF16 activations.
#include <string>

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
