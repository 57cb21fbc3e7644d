// `lair init`'s engine: every family's tiny preset writes a checkpoint that
// Model::Load reads back and runs; overrides go through the config parser.
#include "models/init.h"

#include <cmath>
#include <filesystem>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "models/state_pool.h"

namespace lair::models {
namespace {

class InitFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InitFamilyTest, TinyPresetLoadsRunsAndTrains) {
  std::string dir =
      (std::filesystem::path(::testing::TempDir()) / ("lair_init_" + GetParam())).string();
  InitOptions options;
  options.family = GetParam();
  options.preset = "tiny";
  options.seed = 7;
  options.overrides = {{"num_hidden_layers", "1"}, {"tie_word_embeddings", "true"}};
  if (GetParam() == "xlstm") options.overrides.push_back({"num_blocks", "1"});
  auto params = InitModel(options, dir);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_GT(*params, 0);

  auto backend = kernels::MakeCpuBackend(1);
  auto model = Model::Load(dir, backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->family(), GetParam());
  auto pool = StatePool::Create(backend.get(), (*model)->state_layout(), 1);
  ASSERT_TRUE(pool.ok());
  ForwardBatch batch;
  batch.tokens = {1, 5, 9, 300};
  batch.cu_seqlens = {0, 4};
  batch.slots = {0};
  batch.start_positions = {0};
  auto logits = (*model)->Forward(batch, *pool);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->dim(1), 512);
  auto grads = (*model)->LossAndGrad({1, 5, 9, 300, 2});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_TRUE(std::isfinite(grads->loss));
  EXPECT_NEAR(grads->loss, std::log(512.0), 1.0);  // near-uniform predictions at init

  // The same seed writes the same weights.
  std::string again = dir + "_again";
  ASSERT_TRUE(InitModel(options, again).ok());
  auto first = (*model)->LossAndGrad({3, 4});
  auto reloaded = Model::Load(again, backend.get());
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ((*reloaded)->LossAndGrad({3, 4})->loss, first->loss);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, InitFamilyTest,
                         ::testing::Values("gla", "gsa", "linear_attn", "retnet", "hgrn2", "mamba2",
                                           "xlstm", "llama"));

TEST(InitConfigTest, PresetsAndOverridesAreValidated) {
  auto gla = InitConfig({"", "gla-1.3b", {}, 0});
  ASSERT_TRUE(gla.ok()) << gla.status();
  EXPECT_EQ((*gla)["hidden_size"], 2048);
  EXPECT_EQ((*gla)["num_hidden_layers"], 24);
  EXPECT_EQ((*gla)["vocab_size"], 32000);
  EXPECT_EQ((*gla)["model_type"], "gla");

  auto bad_heads = InitConfig({"gla", "tiny", {{"num_heads", "3"}}, 0});
  ASSERT_FALSE(bad_heads.ok());
  EXPECT_NE(bad_heads.status().message().find("num_heads"), std::string::npos)
      << bad_heads.status();

  auto bad_type = InitConfig({"gla", "tiny", {{"use_short_conv", "maybe"}}, 0});
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.status().message().find("use_short_conv"), std::string::npos);

  EXPECT_FALSE(InitConfig({"llama", "gla-1.3b", {}, 0}).ok());
  EXPECT_FALSE(InitConfig({"gla", "huge", {}, 0}).ok());
  EXPECT_FALSE(InitConfig({"", "", {}, 0}).ok());
}

}  // namespace
}  // namespace lair::models
