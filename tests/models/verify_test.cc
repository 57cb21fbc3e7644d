// GreedyTokensCheck: which greedy differences the model check tolerates.
#include "models/verify.h"

#include <vector>

#include "gtest/gtest.h"

namespace lair::models {
namespace {

// Step 1 differs; its golden margin (1e-3) is below the logit error (1e-2).
std::vector<GreedyStep> CloseCall() {
  return {{7, 7, 0.5, 1e-2}, {3, 4, 1e-3, 1e-2}, {9, 9, 0.2, 1e-2}, {5, 5, 0.3, 1e-2}};
}

TEST(GreedyTokensCheckTest, IdenticalTokensPass) {
  std::vector<GreedyStep> steps = CloseCall();
  steps[1].ours = steps[1].golden;
  for (bool bf16 : {false, true}) {
    ModelCheck check = GreedyTokensCheck(steps, bf16);
    EXPECT_EQ(check.label, "greedy tokens");
    EXPECT_EQ(check.relative_error, 0.0);
    EXPECT_TRUE(check.passed());
  }
}

TEST(GreedyTokensCheckTest, Fp32CountsEveryDifference) {
  ModelCheck check = GreedyTokensCheck(CloseCall(), /*bf16=*/false);
  EXPECT_DOUBLE_EQ(check.relative_error, 0.25);
  EXPECT_FALSE(check.passed());
  EXPECT_NE(check.label.find("step 1: 3 vs golden 4"), std::string::npos) << check.label;
}

TEST(GreedyTokensCheckTest, Bf16ToleratesAMarginBelowTheError) {
  ModelCheck check = GreedyTokensCheck(CloseCall(), /*bf16=*/true);
  EXPECT_EQ(check.relative_error, 0.0);
  EXPECT_TRUE(check.passed());
  EXPECT_NE(check.label.find("margin 1.0e-03 < error 1.0e-02"), std::string::npos) << check.label;
}

TEST(GreedyTokensCheckTest, Bf16CountsADifferenceAboveTheError) {
  std::vector<GreedyStep> steps = CloseCall();
  steps[1].golden_margin = 0.05;
  ModelCheck check = GreedyTokensCheck(steps, /*bf16=*/true);
  EXPECT_DOUBLE_EQ(check.relative_error, 0.25);
  EXPECT_FALSE(check.passed());
  EXPECT_NE(check.label.find(">= error"), std::string::npos) << check.label;
}

}  // namespace
}  // namespace lair::models
