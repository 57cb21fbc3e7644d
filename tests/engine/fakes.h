// Test doubles for the engine: a deterministic ModelRunner, a tiny
// Tokenizer, and a collector of RequestOutputs.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/batch_builder.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/sampling.h"
#include "tokenizer/tokenizer.h"

namespace lair::engine::testing {

// A slot's state is a 64-bit hash of every token folded into it, and logits
// are a pure function of that hash: output depends only on a sequence's
// history, never on its batch, and a wrong Save/Restore/Copy changes it.
class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int vocab = 512, int64_t bytes_per_slot = 1024)
      : vocab_(vocab), bytes_per_slot_(bytes_per_slot) {}

  // A sequence that feeds this token fails its step (tests error isolation).
  void set_fail_token(int32_t token) { fail_token_ = token; }

  int vocab_size() const override { return vocab_; }
  int max_context() const override { return 0; }
  int64_t DefaultStateMemoryBytes() const override { return 64 * bytes_per_slot_; }
  int64_t BytesPerSlot() const override { return bytes_per_slot_; }
  absl::Status CreateSlots(int num_slots) override {
    states_.assign(num_slots, 0);
    return absl::OkStatus();
  }
  absl::Status ZeroSlot(int slot) override {
    states_.at(slot) = 0;
    return absl::OkStatus();
  }
  absl::Status CopySlot(int from, int to) override {
    ++copies;
    states_.at(to) = states_.at(from);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> SaveSlot(int slot) override {
    ++saves;
    return std::to_string(states_.at(slot));
  }
  absl::Status RestoreSlot(int slot, const std::string& bytes) override {
    ++restores;
    states_.at(slot) = std::stoull(bytes);
    return absl::OkStatus();
  }

  RunnerOutput Execute(const ScheduleOutput& schedule) override {
    RunnerOutput out;
    absl::StatusOr<PreparedBatch> batch = builder_.Prepare(schedule);
    if (!batch.ok()) {
      for (const auto& [id, count] : schedule.num_scheduled_tokens) {
        out.failures.push_back({id, batch.status()});
      }
      return out;
    }
    const models::ForwardBatch& f = batch->forward;
    tokens_run += static_cast<int64_t>(f.tokens.size());
    steps += 1;
    // As ModelRunnerImpl: tokens for the sequences drawn on the "device"
    // (none while a prompt is scored), logits for the others.
    bool scoring = false;
    for (int i = 0; i < f.num_seqs(); ++i) scoring |= batch->prompt_rows[i] > 0;
    for (int i = 0; i < f.num_seqs(); ++i) {
      uint64_t& state = states_.at(f.slots[i]);
      bool failed = false;
      for (int t = f.cu_seqlens[i]; t < f.cu_seqlens[i + 1]; ++t) {
        failed |= f.tokens[t] == fail_token_;
        state = Mix(state ^ static_cast<uint64_t>(f.tokens[t] + 1));
      }
      if (failed) {
        out.failures.push_back({batch->ids[i], absl::InternalError("fake runner: poisoned token")});
      } else if (batch->needs_logits[i]) {
        std::vector<float> logits(vocab_);
        for (int v = 0; v < vocab_; ++v) {
          logits[v] = static_cast<float>(Mix(state + static_cast<uint64_t>(v)) % 1000) / 100.0f;
        }
        const auto drawn = schedule.device_sampling.find(batch->ids[i]);
        if (!scoring && drawn != schedule.device_sampling.end()) {
          out.tokens.push_back(DrawOnDevice(batch->ids[i], logits, drawn->second));
          ++device_draws;
        } else {
          out.logits.push_back({batch->ids[i], std::move(logits)});
          ++host_draws;
        }
      }
    }
    return out;
  }

  static uint64_t Mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  std::atomic<int64_t> tokens_run{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> device_draws{0};  // tokens returned
  std::atomic<int64_t> host_draws{0};    // logits rows returned for the host to sample
  std::atomic<int64_t> saves{0};
  std::atomic<int64_t> restores{0};
  std::atomic<int64_t> copies{0};

 private:
  // The draw and its logprobs as the CPU backend's SampleRows makes them.
  SequenceToken DrawOnDevice(SequenceId id, const std::vector<float>& logits,
                             const kernels::RowSampling& rule) const {
    const Tensor row = Tensor::FromFloats({1, vocab_}, logits);
    const Tensor token = Tensor::Zeros(DType::kI32, {1});
    const kernels::DrawLogprobs drawn{Tensor::Zeros(DType::kF32, {1, 1 + kernels::kMaxRowLogprobs}),
                                      Tensor::Zeros(DType::kI32, {1, kernels::kMaxRowLogprobs})};
    const kernels::RowSampling rules[] = {rule};
    EXPECT_TRUE(cpu_->SampleRows(row, rules, token, drawn).ok());
    SequenceToken out{.id = id, .token = token.data<int32_t>()[0], .logprob = std::nullopt};
    if (rule.logprobs >= 0) out.logprob = DrawnLogprob(drawn, 0, out.token, rule.logprobs);
    return out;
  }

  const int vocab_;
  const std::unique_ptr<kernels::Backend> cpu_ = kernels::MakeCpuBackend(1);
  const int64_t bytes_per_slot_;
  std::optional<int32_t> fail_token_;
  std::vector<uint64_t> states_;
  BatchBuilder builder_;
};

// Token t < 500 is two letters (so stop strings can end inside a token);
// 500..510 are spaces; 511 is the special EOS "</s>".
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kEos = 511;
  std::vector<int32_t> Encode(std::string_view, bool) const override { return {}; }
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string text;
    for (int32_t id : ids) {
      if (!(skip_special_tokens && IsSpecial(id))) text += IdToToken(id);
    }
    return text;
  }
  int VocabSize() const override { return 512; }
  std::optional<int32_t> TokenToId(std::string_view) const override { return std::nullopt; }
  std::string IdToToken(int32_t id) const override {
    if (id == kEos) return "</s>";
    if (id >= 500) return " ";
    return {static_cast<char>('a' + id % 26), static_cast<char>('a' + (id / 26) % 26)};
  }
  bool IsSpecial(int32_t id) const override { return id == kEos; }
  std::optional<int32_t> BosId() const override { return std::nullopt; }
  std::optional<int32_t> EosId() const override { return kEos; }
  std::string_view ChatTemplate() const override { return {}; }
};

// What one completion streamed, concatenated.
struct Completion {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;
  FinishReason reason = FinishReason::kNone;
  std::string stop_reason;
  absl::Status status;
  Usage usage;
  RequestTimings timings;
  int outputs = 0;
};

class Collector {
 public:
  OutputCallback Callback() {
    return [this](const RequestOutput& out) {
      absl::MutexLock lock(&mu_);
      Completion& c = completions_[{out.request_id, out.index}];
      EXPECT_EQ(c.reason, FinishReason::kNone) << "output after the final one";
      c.tokens.insert(c.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
      c.text += out.text_delta;
      c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      EXPECT_TRUE(out.prompt_logprobs.empty() || c.outputs == 0) << "prompt scored twice";
      c.prompt_logprobs.insert(c.prompt_logprobs.end(), out.prompt_logprobs.begin(),
                               out.prompt_logprobs.end());
      c.reason = out.finish_reason;
      c.stop_reason = out.stop_reason;
      c.status = out.status;
      c.usage = out.usage;
      c.timings = out.timings;
      ++c.outputs;
      if (out.finished()) ++finished_;
    };
  }
  // Waits until `count` completions have finished; false on timeout.
  bool WaitFinished(int count, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  Completion Get(const std::string& id, int index = 0) {
    absl::MutexLock lock(&mu_);
    return completions_[{id, index}];
  }
  int finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, Completion> completions_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lair::engine::testing
