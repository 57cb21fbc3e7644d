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
