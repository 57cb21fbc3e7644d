// Model behaviour beyond the goldens: prefill split anywhere, state slots
// copied / saved / restored, mixed batches of prefill chunks and decode
// steps, and load-time errors that name the bad field or tensor.
#include "models/model.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "models/state_pool.h"
#include "nlohmann/json.hpp"
#include "tests/support/fixtures.h"

namespace lair::models {
namespace {

std::vector<int32_t> Prompt(const std::string& dir) {
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  EXPECT_TRUE(golden.ok()) << golden.status();
  Tensor t = *(*golden)->Get("prompt_a");
  std::vector<int32_t> ids(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) ids[i] = static_cast<int32_t>(t.data<int64_t>()[i]);
  return ids;
}

ForwardBatch Single(const std::vector<int32_t>& tokens, int slot, int start, bool all_logits) {
  ForwardBatch b;
  b.tokens = tokens;
  b.cu_seqlens = {0, static_cast<int32_t>(tokens.size())};
  b.slots = {slot};
  b.start_positions = {start};
  b.all_logits = all_logits;
  return b;
}

// Logits of a prefill of prompt[0, 40) into slot 0 of a fresh one-slot
// pool (every position), then of three decode steps of prompt[40, 43).
void PrefillThenThreeSteps(Model& model, kernels::Backend* backend,
                           const std::vector<int32_t>& prompt, std::vector<Tensor>* logits) {
  auto pool = StatePool::Create(backend, model.state_layout(), 1);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
  auto prefill = model.Forward(Single(head, 0, 0, true), *pool);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  logits->push_back(*prefill);
  for (int i = 40; i < 43; ++i) {
    auto step = model.Forward(Single({prompt[i]}, 0, i, false), *pool);
    ASSERT_TRUE(step.ok()) << step.status();
    logits->push_back(*step);
  }
}

// Row `row` of a [R, V] host tensor as [1, V].
Tensor Row(const Tensor& t, int64_t row) { return t.Rows(row, row + 1).Clone(); }

class ModelBehaviourTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::FixturesDir() + "/models/" + GetParam();
    if (!std::filesystem::exists(dir_)) GTEST_SKIP() << "fixture " << dir_ << " is absent";
    backend_ = kernels::MakeCpuBackend(2);
    LoadOptions options;
    options.max_context = 128;
    auto model = Model::Load(dir_, backend_.get(), options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto pool = StatePool::Create(backend_.get(), model_->state_layout(), 4);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::make_unique<StatePool>(std::move(*pool));
    prompt_ = Prompt(dir_);
  }

  Tensor Run(const ForwardBatch& batch) {
    auto logits = model_->Forward(batch, *pool_);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : Tensor();
  }

  std::string dir_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<StatePool> pool_;
  std::vector<int32_t> prompt_;
};

TEST_P(ModelBehaviourTest, PrefillSplitAnywhereGivesTheSameLogits) {
  Tensor full = Run(Single(prompt_, 0, 0, true));
  for (int split : {1, 17, 64, 99}) {
    ASSERT_TRUE(pool_->Zero(1).ok());
    std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + split),
        tail(prompt_.begin() + split, prompt_.end());
    Tensor first = Run(Single(head, 1, 0, true));
    Tensor second = Run(Single(tail, 1, split, true));
    EXPECT_LT(RelativeError(first, full.Rows(0, split).Clone()), 1e-5) << "split " << split;
    EXPECT_LT(RelativeError(second, full.Rows(split, full.dim(0)).Clone()), 1e-5)
        << "split " << split;
  }
}

TEST_P(ModelBehaviourTest, CopiedSavedAndRestoredSlotsContinueIdentically) {
  const int split = 40;
  std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + split),
      tail(prompt_.begin() + split, prompt_.end());
  Run(Single(head, 0, 0, false));
  auto saved = pool_->Save(0);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(pool_->CopySlot(0, 1).ok());
  ASSERT_TRUE(pool_->Restore(2, *saved).ok());
  Tensor a = Run(Single(tail, 0, split, true));
  Tensor b = Run(Single(tail, 1, split, true));
  Tensor c = Run(Single(tail, 2, split, true));
  EXPECT_EQ(RelativeError(b, a), 0.0);
  EXPECT_EQ(RelativeError(c, a), 0.0);
  // A zeroed slot starts over: its logits differ from the continued ones.
  ASSERT_TRUE(pool_->Zero(3).ok());
  Tensor fresh = Run(Single(tail, 3, 0, true));
  EXPECT_GT(RelativeError(fresh, a), 1e-3);
  // Bytes that do not describe this layout are refused.
  std::string corrupt = *saved;
  corrupt[12] ^= 1;
  EXPECT_FALSE(pool_->Restore(2, corrupt).ok());
  EXPECT_FALSE(pool_->Restore(2, saved->substr(0, saved->size() - 4)).ok());
}

TEST_P(ModelBehaviourTest, MixedBatchEqualsEachSequenceAlone) {
  // Slot 0: a 30-token prefill; slot 1: a 5-token prefill after 20 cached
  // tokens; slot 2: one decode step after 50 cached tokens.
  std::vector<int32_t> p0(prompt_.begin(), prompt_.begin() + 30);
  std::vector<int32_t> cached1(prompt_.begin(), prompt_.begin() + 20),
      p1(prompt_.begin() + 20, prompt_.begin() + 25);
  std::vector<int32_t> cached2(prompt_.begin() + 10, prompt_.begin() + 60), p2 = {prompt_[60]};
  auto prepare = [&] {
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(pool_->Zero(s).ok());
    Run(Single(cached1, 1, 0, false));
    Run(Single(cached2, 2, 0, false));
  };
  prepare();
  Tensor alone0 = Run(Single(p0, 0, 0, true));
  Tensor alone1 = Run(Single(p1, 1, 20, true));
  Tensor alone2 = Run(Single(p2, 2, 50, true));
  prepare();
  ForwardBatch batch;
  batch.tokens = p0;
  batch.tokens.insert(batch.tokens.end(), p1.begin(), p1.end());
  batch.tokens.insert(batch.tokens.end(), p2.begin(), p2.end());
  batch.cu_seqlens = {0, 30, 35, 36};
  batch.slots = {0, 1, 2};
  batch.start_positions = {0, 20, 50};
  batch.all_logits = true;
  Tensor mixed = Run(batch);
  EXPECT_LT(RelativeError(mixed.Rows(0, 30).Clone(), alone0), 1e-5);
  EXPECT_LT(RelativeError(mixed.Rows(30, 35).Clone(), alone1), 1e-5);
  EXPECT_LT(RelativeError(mixed.Rows(35, 36).Clone(), alone2), 1e-5);
  // Without all_logits, one row per sequence: its last token's.
  prepare();
  batch.all_logits = false;
  Tensor last = Run(batch);
  ASSERT_EQ(last.dim(0), 3);
  EXPECT_LT(RelativeError(Row(last, 0), Row(alone0, 29)), 1e-5);
  EXPECT_LT(RelativeError(Row(last, 1), Row(alone1, 4)), 1e-5);
  EXPECT_LT(RelativeError(Row(last, 2), alone2), 1e-5);
  // With logit_rows, exactly those rows, in that order.
  prepare();
  batch.logit_rows = {33, 3, 35};
  Tensor picked = Run(batch);
  ASSERT_EQ(picked.dim(0), 3);
  EXPECT_LT(RelativeError(Row(picked, 0), Row(alone1, 3)), 1e-5);
  EXPECT_LT(RelativeError(Row(picked, 1), Row(alone0, 3)), 1e-5);
  EXPECT_LT(RelativeError(Row(picked, 2), alone2), 1e-5);
}

TEST_P(ModelBehaviourTest, RejectsMalformedBatches) {
  ForwardBatch bad = Single({prompt_[0], 100000}, 0, 0, false);
  EXPECT_FALSE(model_->Forward(bad, *pool_).ok());
  ForwardBatch twice = Single({1, 2}, 0, 0, false);
  twice.cu_seqlens = {0, 1, 2};
  twice.slots = {0, 0};
  twice.start_positions = {0, 0};
  EXPECT_FALSE(model_->Forward(twice, *pool_).ok());
  ForwardBatch out_of_pool = Single({1}, 7, 0, false);
  EXPECT_FALSE(model_->Forward(out_of_pool, *pool_).ok());
  ForwardBatch past_the_tokens = Single({1, 2}, 0, 0, false);
  past_the_tokens.logit_rows = {2};
  EXPECT_FALSE(model_->Forward(past_the_tokens, *pool_).ok());
  ForwardBatch both = Single({1, 2}, 0, 0, true);
  both.logit_rows = {0};
  EXPECT_FALSE(model_->Forward(both, *pool_).ok());
}

INSTANTIATE_TEST_SUITE_P(Families, ModelBehaviourTest,
                         ::testing::Values("llama-tiny", "gla-tiny", "mamba2-tiny", "xlstm-tiny",
                                           "gsa-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(0, info.param.find('-'));
                         });

// --- Norm weights folded into the products (LoadOptions::fold_norm_weights) --

class FoldedNormsTest : public ::testing::TestWithParam<std::string> {};

// Folding changes only where the norms' weights are applied (f32: rounding),
// so prefill and decode give the unfolded model's logits; the folded model
// refuses to train, since its weights are no longer the checkpoint's.
TEST_P(FoldedNormsTest, GiveTheUnfoldedLogitsAndRefuseToTrain) {
  const std::string dir = testing::FixturesDir() + "/models/" + GetParam();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "fixture " << dir << " is absent";
  auto backend = kernels::MakeCpuBackend(2);
  const std::vector<int32_t> prompt = Prompt(dir);
  std::vector<Tensor> logits[2];
  for (bool fold : {false, true}) {
    LoadOptions options;
    options.max_context = 128;
    options.fold_norm_weights = fold;
    auto model = Model::Load(dir, backend.get(), options);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_NO_FATAL_FAILURE(PrefillThenThreeSteps(**model, backend.get(), prompt, &logits[fold]));
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
    const absl::StatusOr<LossAndGradients> trained = (*model)->LossAndGrad(head);
    if (fold) {
      EXPECT_EQ(trained.status().code(), absl::StatusCode::kFailedPrecondition);
    } else {
      EXPECT_TRUE(trained.ok()) << trained.status();
    }
  }
  for (size_t i = 0; i < logits[0].size(); ++i)
    EXPECT_LT(RelativeError(logits[1][i], logits[0][i]), 1e-5) << "forward " << i;
}

INSTANTIATE_TEST_SUITE_P(Families, FoldedNormsTest,
                         ::testing::Values("gla-tiny", "gsa-tiny", "hgrn2-tiny", "linear_attn-tiny",
                                           "llama-tiny", "mamba2-tiny", "retnet-tiny",
                                           "xlstm-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.substr(0, info.param.find('-'));
                         });

// --- Low-rank gates fused for decode steps (LoadOptions::fuse_low_rank_gates)

// The CPU never forms a low-rank gate in its decay step, so GLA's decode
// steps read gk_proj.1 · gk_proj.0 as one weight among the input products.
// In f32 that changes only rounding. With 16-bit weights the fused matrix is
// rounded as one, so the decode steps, and only they, move from the unfused
// model's logits, within the bf16 tolerance. The model reports the
// checkpoint's parameters, holds the fused weight beside them, and refuses to
// train.
TEST(FusedLowRankGatesTest, DecodeStepsReadTheFusedGate) {
  const std::string dir = testing::FixturesDir() + "/models/gla-tiny";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "fixture " << dir << " is absent";
  auto backend = kernels::MakeCpuBackend(2);
  const std::vector<int32_t> prompt = Prompt(dir);
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string what = dtype == DType::kF32 ? "f32" : "bf16";
    std::vector<Tensor> logits[2];
    ModelSize size[2];
    for (bool fuse : {false, true}) {
      LoadOptions options;
      options.max_context = 128;
      options.weight_dtype = dtype;
      options.fuse_low_rank_gates = fuse;
      auto model = Model::Load(dir, backend.get(), options);
      ASSERT_TRUE(model.ok()) << model.status();
      size[fuse] = (*model)->size();
      ASSERT_NO_FATAL_FAILURE(PrefillThenThreeSteps(**model, backend.get(), prompt, &logits[fuse]));
      if (fuse) {
        EXPECT_EQ((*model)->LossAndGrad(head).status().code(),
                  absl::StatusCode::kFailedPrecondition);
      }
    }
    EXPECT_EQ(size[1].parameters, size[0].parameters) << what;
    EXPECT_GT(size[1].weight_bytes, size[0].weight_bytes) << what;
    EXPECT_EQ(RelativeError(logits[1][0], logits[0][0]), 0.0) << what << " prefill";
    for (size_t i = 1; i < logits[0].size(); ++i) {
      const double error = RelativeError(logits[1][i], logits[0][i]);
      EXPECT_LT(error, dtype == DType::kF32 ? 1e-5 : 3e-2) << what << " step " << i;
      if (dtype != DType::kF32) {
        EXPECT_GT(error, 0.0) << what << " step " << i;
      }
    }
  }
}

// --- Load-time errors ----------------------------------------------------

class LoadErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = testing::FixturesDir() + "/models/gla-tiny";
    if (!std::filesystem::exists(source_)) GTEST_SKIP() << "fixture " << source_ << " is absent";
    dir_ = std::filesystem::path(::testing::TempDir()) / "lair_bad_model";
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ifstream in(source_ + "/config.json");
    config_ = nlohmann::json::parse(in);
    auto checkpoint = Checkpoint::Open(source_);
    ASSERT_TRUE(checkpoint.ok());
    for (const std::string& name : checkpoint->Names())
      tensors_.emplace_back(name, *checkpoint->Get(name));
    backend_ = kernels::MakeCpuBackend(1);
  }

  // Writes the (edited) config and tensors, loads, returns the error text.
  std::string LoadError() {
    std::ofstream(dir_ / "config.json") << config_.dump();
    EXPECT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(), tensors_).ok());
    auto model = Model::Load(dir_.string(), backend_.get());
    EXPECT_FALSE(model.ok());
    return model.ok() ? "" : std::string(model.status().message());
  }

  std::string source_;
  std::filesystem::path dir_;
  nlohmann::json config_;
  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(LoadErrorTest, UnknownModelTypeIsNamed) {
  config_["model_type"] = "rwkv42";
  std::string error = LoadError();
  EXPECT_NE(error.find("model_type"), std::string::npos) << error;
  EXPECT_NE(error.find("rwkv42"), std::string::npos) << error;
}

TEST_F(LoadErrorTest, UnsupportedOptionIsNamed) {
  config_["use_gv"] = true;
  EXPECT_NE(LoadError().find("use_gv"), std::string::npos);
  config_["use_gv"] = false;
  config_["attn"] = {{"layers", {0}}, {"num_heads", 2}};
  EXPECT_NE(LoadError().find("'attn'"), std::string::npos);
}

TEST_F(LoadErrorTest, MistypedFieldIsNamed) {
  config_["num_heads"] = "two";
  EXPECT_NE(LoadError().find("num_heads"), std::string::npos);
}

TEST_F(LoadErrorTest, MissingTensorIsNamed) {
  std::erase_if(tensors_,
                [](const auto& t) { return t.first == "model.layers.1.attn.gk_proj.1.bias"; });
  EXPECT_NE(LoadError().find("model.layers.1.attn.gk_proj.1.bias"), std::string::npos);
}

TEST_F(LoadErrorTest, WrongShapeIsNamed) {
  for (auto& [name, t] : tensors_) {
    if (name == "model.layers.0.attn.q_proj.weight") t = Tensor::Zeros(DType::kF32, {64, 64});
  }
  std::string error = LoadError();
  EXPECT_NE(error.find("model.layers.0.attn.q_proj.weight"), std::string::npos) << error;
}

}  // namespace
}  // namespace lair::models
