// Every fixture model against its goldens: prefill and one-token logits,
// greedy tokens and logits, and (where the fixture has them) the loss and
// every parameter gradient, at the tolerances of fixtures/README.md.
#include "tests/support/fixtures.h"

#include <string>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "models/verify.h"

namespace lair::models {
namespace {

class FixtureModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModelTest, MatchesGoldens) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/" + GetParam());
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(2);
  ModelReport report = VerifyModel(dir, backend.get());
  ASSERT_TRUE(report.status.ok()) << report.status;
  // The tolerances are VerifyModel's: fixtures/README.md's, except where
  // models/verify.cc records evidence that a golden is noisier.
  for (const ModelCheck& check : report.checks) {
    EXPECT_LE(check.relative_error, check.tolerance) << GetParam() << ": " << check.label;
  }
  EXPECT_GE(report.checks.size(), 6u);
}

// With bf16 weights the CPU multiplies the F32 values of the rounded
// matrices, the reference a bf16 device run is judged against: rounding
// linear_attn-tiny's matrices alone moves prompt_b's logits by 1.3e-2 (1.2e-1
// with the norms' weights kept out of the matrices, past the 2e-2 bf16
// tolerance), so each logits tolerance adds what rounding costs.
TEST(FixtureModelBf16Test, ToleranceAddsWhatRoundingTheWeightsCosts) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/linear_attn-tiny");
  std::unique_ptr<kernels::Backend> cpu = kernels::MakeCpuBackend(2);
  VerifyModelOptions options;
  options.weight_dtype = DType::kBF16;
  options.gradients = false;
  ModelReport report = VerifyModel(dir, cpu.get(), options);
  ASSERT_TRUE(report.status.ok()) << report.status;
  bool saw_b = false;
  for (const ModelCheck& check : report.checks) {
    EXPECT_TRUE(check.passed()) << check.label;
    if (check.label.starts_with("prefill logits_b")) {
      saw_b = true;
      EXPECT_GT(check.relative_error, 5e-3);  // rounding alone
      EXPECT_NEAR(check.tolerance, 2e-2 + check.relative_error, 1e-9);
    }
  }
  EXPECT_TRUE(saw_b);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, FixtureModelTest,
                         ::testing::Values("llama-tiny", "gla-tiny", "gla-tiny-bf16", "gsa-tiny",
                                           "linear_attn-tiny", "retnet-tiny", "hgrn2-tiny",
                                           "mamba2-tiny", "xlstm-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace lair::models
