// EngineImpl: the engine thread and its locked input queue.
//
// Threading: Submit, Cancel, Stats and Shutdown only touch the state under
// mu_ (the input and cancel queues, live ids, the stats snapshot). The
// engine thread owns everything else (scheduler, state cache, sequences,
// request groups) and takes mu_ only to drain the queues and publish stats,
// never while calling the runner or a callback.
//
// Each loop iteration: admit submitted requests, apply cancels (slots freed
// at once), cancel everything past the shutdown deadline, run one Step(),
// send outputs, publish stats. A failure inside a request (its state could
// not be restored, or the runner failed its sequence) finishes that request
// with kError; the loop goes on.
#include "engine/engine.h"

#include <algorithm>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/parallel.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/state_cache.h"
#include "tokenizer/tokenizer.h"

namespace lair::engine {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
             const EngineConfig& config, std::unique_ptr<StateCache> cache)
      : runner_(std::move(runner)),
        tokenizer_(tokenizer),
        config_(config),
        vocab_size_(runner_->vocab_size()),
        max_context_(runner_->max_context()),
        eos_(tokenizer != nullptr ? tokenizer->EosId() : std::nullopt),
        cache_(std::move(cache)),
        scheduler_({config.max_batch_tokens, config.max_running, config.preempt_quantum_tokens},
                   cache_.get()),
        seed_rng_(std::random_device{}()) {
    absl::MutexLock lock(&join_mu_);
    thread_ = std::thread([this] { Loop(); });
  }
  ~EngineImpl() override { Shutdown(absl::ZeroDuration()); }

  absl::Status Submit(EngineRequest request, OutputCallback on_output) override;
  void Cancel(const std::string& request_id) override;
  EngineStats Stats() const override;
  void Shutdown(absl::Duration grace) override;

 private:
  struct Submission {
    EngineRequest request;
    OutputCallback on_output;
    absl::Time arrival;
  };

  absl::Status Validate(const EngineRequest& request) const;
  bool HasInputOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !inputs_.empty() || !cancels_.empty() || stop_deadline_.has_value();
  }

  // --- Engine thread ------------------------------------------------------
  void Loop();
  void Step();
  void Admit(Submission submission);
  // Whether seq's next draw reads nothing but its raw logits, so the runner
  // may make it on the device (ScheduleOutput::device_sampling).
  static bool SamplesOnDevice(const Sequence& seq);
  // The host's draws for the step's logits rows (result.logits): those of
  // sequences that draw for themselves alone run in parallel (each reads
  // only its own logits, counts and RNG), then all are recorded in order.
  void DrawOnHost(std::vector<SequenceLogits>& rows, absl::Time now);
  // Samples seq's next token from `logits` and, at a request's first
  // sample with n > 1, forks its siblings.
  void Advance(Sequence* seq, std::vector<float> logits, absl::Time now);
  void Accept(Sequence* seq, std::vector<float> logits, absl::Time now);
  // seq's next token from `logits` (overwritten), on the host sampler.
  SampleResult Draw(Sequence* seq, std::span<float> logits) const;
  // Appends a sampled token to seq and its output.
  void Record(Sequence* seq, SampleResult sample, absl::Time now);
  void Fork(Sequence* leader, const std::vector<float>& logits, absl::Time now);
  // Scores the prompt tokens that `prompt`'s logits predict into the group.
  void ScorePrompt(Sequence* seq, PromptLogits& prompt);
  // Frees seq's slot and forgets it. REQUIRES: its output is finished.
  void Retire(Sequence* seq);
  // Ends every unfinished completion of `group` with `reason`.
  void Abort(RequestGroup* group, FinishReason reason, const absl::Status& status);
  Sequence* Find(SequenceId id);
  // Sends pending outputs of the groups touched this iteration.
  void Emit();
  void PublishStats();

  // Constant after construction.
  const std::unique_ptr<ModelRunner> runner_;
  const Tokenizer* const tokenizer_;
  const EngineConfig config_;
  const int vocab_size_;
  const int max_context_;
  const std::optional<int32_t> eos_;

  // Engine thread only.
  std::unique_ptr<StateCache> cache_;
  Scheduler scheduler_;
  absl::flat_hash_map<std::string, std::unique_ptr<RequestGroup>> requests_;
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  absl::flat_hash_set<RequestGroup*> touched_;
  SequenceId next_id_ = 0;
  std::mt19937_64 seed_rng_;  // seeds for requests without one
  int64_t prompt_tokens_total_ = 0;
  int64_t generated_tokens_total_ = 0;
  int64_t steps_total_ = 0;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  std::vector<Submission> inputs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> live_ids_ ABSL_GUARDED_BY(mu_);  // submitted, not all final
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  std::optional<absl::Time> stop_deadline_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex join_mu_;  // serializes Shutdown's join
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

absl::Status EngineImpl::Validate(const EngineRequest& r) const {
  const SamplingParams& p = r.sampling;
  if (r.request_id.empty()) return Invalid("request_id", "must not be empty");
  if (r.prompt_tokens.empty()) return Invalid("prompt_tokens", "must not be empty");
  const int prompt = static_cast<int>(r.prompt_tokens.size());
  if (prompt > config_.max_prompt_tokens) {
    return Invalid("prompt_tokens", absl::StrCat(prompt, " tokens exceed max_prompt_tokens ",
                                                 config_.max_prompt_tokens));
  }
  if (max_context_ > 0 && prompt >= max_context_) {
    return Invalid("prompt_tokens", absl::StrCat(prompt, " tokens leave no room in the model's ",
                                                 max_context_, "-token context"));
  }
  for (int32_t t : r.prompt_tokens) {
    if (t < 0 || t >= vocab_size_) {
      return Invalid(
          "prompt_tokens",
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", vocab_size_, ")"));
    }
  }
  if (p.n < 1) return Invalid("sampling.n", absl::StrCat("must be at least 1, got ", p.n));
  if (p.max_tokens < 1 || p.max_tokens > config_.max_new_tokens) {
    return Invalid("sampling.max_tokens", absl::StrCat("must be in [1, ", config_.max_new_tokens,
                                                       "], got ", p.max_tokens));
  }
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return Invalid("sampling.min_tokens", absl::StrCat("must be in [0, max_tokens ", p.max_tokens,
                                                       "], got ", p.min_tokens));
  }
  if (!(p.temperature >= 0)) return Invalid("sampling.temperature", "must be >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) return Invalid("sampling.top_p", "must be in (0, 1]");
  if (p.top_k < 0) return Invalid("sampling.top_k", "must be >= 0 (0 = off)");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return Invalid("sampling.min_p", "must be in [0, 1]");
  if (!(p.repetition_penalty > 0)) return Invalid("sampling.repetition_penalty", "must be > 0");
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs) {
    return Invalid("sampling.logprobs",
                   absl::StrCat("must be in [-1, ", kMaxLogprobs, "], got ", p.logprobs));
  }
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > kMaxLogprobs) {
    return Invalid("sampling.prompt_logprobs",
                   absl::StrCat("must be in [-1, ", kMaxLogprobs, "], got ", p.prompt_logprobs));
  }
  for (const auto& [t, bias] : p.logit_bias) {
    if (t < 0 || t >= vocab_size_) {
      return Invalid("sampling.logit_bias",
                     absl::StrCat("token id ", t, " is outside the vocabulary"));
    }
  }
  const std::pair<const char*, const std::vector<int32_t>*> id_lists[] = {
      {"sampling.stop_token_ids", &p.stop_token_ids},
      {"sampling.allowed_token_ids", &p.allowed_token_ids}};
  for (const auto& [field, ids] : id_lists) {
    for (int32_t t : *ids) {
      if (t < 0 || t >= vocab_size_) {
        return Invalid(field, absl::StrCat("token id ", t, " is outside the vocabulary"));
      }
    }
  }
  // min_tokens masks the stop tokens: some allowed token must remain.
  if (p.min_tokens > 0 && !p.allowed_token_ids.empty() &&
      std::all_of(p.allowed_token_ids.begin(), p.allowed_token_ids.end(),
                  [&](int32_t t) { return IsStopToken(p, eos_, t); })) {
    return Invalid("sampling.allowed_token_ids",
                   "only stop tokens are allowed, so min_tokens cannot be met");
  }
  if (!p.stop.empty() && tokenizer_ == nullptr) {
    return Invalid("sampling.stop", "stop strings need a tokenizer and the engine has none");
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) return Invalid("sampling.stop", "a stop string must not be empty");
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::Submit(EngineRequest request, OutputCallback on_output) {
  LAIR_RETURN_IF_ERROR(Validate(request));
  if (!on_output) return Invalid("on_output", "must be set");
  absl::MutexLock lock(&mu_);
  if (!accepting_) return absl::FailedPreconditionError("engine is shutting down");
  if (live_ids_.contains(request.request_id)) {
    return Invalid("request_id", absl::StrCat("'", request.request_id, "' is already live"));
  }
  if (static_cast<int>(inputs_.size()) + stats_.waiting >= config_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("engine queue is full (max_waiting ", config_.max_waiting, ")"));
  }
  live_ids_.insert(request.request_id);
  inputs_.push_back({std::move(request), std::move(on_output), absl::Now()});
  return absl::OkStatus();
}

void EngineImpl::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (live_ids_.contains(request_id)) cancels_.push_back(request_id);
}

EngineStats EngineImpl::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void EngineImpl::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
    const absl::Time deadline = absl::Now() + grace;
    if (!stop_deadline_.has_value() || deadline < *stop_deadline_) stop_deadline_ = deadline;
  }
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

void EngineImpl::Loop() {
  while (true) {
    std::vector<Submission> inputs;
    std::vector<std::string> cancels;
    std::optional<absl::Time> deadline;
    {
      absl::MutexLock lock(&mu_);
      if (!scheduler_.has_work()) mu_.Await(absl::Condition(this, &EngineImpl::HasInputOrStop));
      inputs.swap(inputs_);
      stats_.waiting += static_cast<int>(inputs.size());  // Submit's queue bound stays exact
      cancels.swap(cancels_);
      deadline = stop_deadline_;
    }
    for (Submission& s : inputs) Admit(std::move(s));
    for (const std::string& id : cancels) {
      if (auto it = requests_.find(id); it != requests_.end()) {
        Abort(it->second.get(), FinishReason::kCancelled, absl::OkStatus());
      }
    }
    if (deadline.has_value() && absl::Now() >= *deadline) {
      for (auto& [id, group] : requests_) {
        Abort(group.get(), FinishReason::kCancelled, absl::CancelledError("engine shut down"));
      }
    }
    if (scheduler_.has_work()) Step();
    Emit();
    PublishStats();
    if (deadline.has_value() && !scheduler_.has_work()) return;
  }
}

// One iteration: schedule -> run -> sample -> outputs (sent by Loop).
void EngineImpl::Step() {
  ScheduleOutput schedule = scheduler_.Schedule();
  for (auto& [seq, status] : scheduler_.TakeFailed()) {
    Abort(&seq->group(), FinishReason::kError, status);
  }
  if (schedule.empty()) return;
  const absl::Time start = absl::Now();
  // Each sequence due to sample whose draw reads only its raw logits draws
  // on the device, with a uniform from its own RNG; the others' logits come
  // to the host sampler, which draws from theirs. A scored prompt needs the
  // step's logits rows in another form, so then every draw is the host's.
  std::vector<Sequence*> drawn;
  bool scoring = false;
  for (const auto& [id, count] : schedule.num_scheduled_tokens) {
    Sequence* seq = Find(id);
    for (OutputProcessor& out : seq->group().outputs) out.MarkScheduled(start);
    scoring |= seq->params().prompt_logprobs >= 0 &&
               seq->num_computed_tokens - count < seq->num_prompt_tokens();
    const bool due = seq->num_computed_tokens == seq->num_tokens();
    if (due && SamplesOnDevice(*seq)) drawn.push_back(seq);
  }
  if (scoring) drawn.clear();
  for (Sequence* seq : drawn) {
    const SamplingParams& p = seq->params();
    schedule.device_sampling[seq->id()] =
        DrawRule(p, p.temperature > 0 ? seq->sampling().NextUniform() : 0.0);
  }
  RunnerOutput result = runner_->Execute(schedule);
  const absl::Time now = absl::Now();
  for (SequenceFailure& f : result.failures) {
    if (Sequence* seq = Find(f.id)) Abort(&seq->group(), FinishReason::kError, f.status);
  }
  for (PromptLogits& p : result.prompt_logits) {
    if (Sequence* seq = Find(p.id)) ScorePrompt(seq, p);
  }
  DrawOnHost(result.logits, now);
  for (const SequenceToken& t : result.tokens) {
    Sequence* seq = Find(t.id);
    if (seq == nullptr) continue;
    Record(seq, SampleResult{.token = t.token, .logprob = t.logprob}, now);
    if (seq->output().finished()) Retire(seq);
  }
  ++steps_total_;
}

bool EngineImpl::SamplesOnDevice(const Sequence& seq) {
  const SamplingParams& p = seq.params();
  return p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f && p.logit_bias.empty() && p.allowed_token_ids.empty() &&
         seq.output().num_generated() >= p.min_tokens &&
         (seq.group().forked || p.n == 1);  // a fork samples its siblings from the leader's logits
}

void EngineImpl::Admit(Submission s) {
  auto group = std::make_unique<RequestGroup>();
  group->request = std::move(s.request);
  group->on_output = std::move(s.on_output);
  const EngineRequest& r = group->request;
  group->seed = r.sampling.seed.has_value() ? *r.sampling.seed : seed_rng_();
  group->outputs.reserve(r.sampling.n);
  for (int i = 0; i < r.sampling.n; ++i) {
    group->outputs.emplace_back(tokenizer_, &r.sampling, r.request_id, i,
                                static_cast<int>(r.prompt_tokens.size()), s.arrival);
  }
  group->unfinished = r.sampling.n;
  auto seq = std::make_unique<Sequence>(next_id_++, group.get(), 0, r.prompt_tokens, 0, "");
  group->live.push_back(seq.get());
  scheduler_.AddWaiting(seq.get());
  prompt_tokens_total_ += static_cast<int64_t>(r.prompt_tokens.size());
  sequences_.emplace(seq->id(), std::move(seq));
  requests_.emplace(r.request_id, std::move(group));
}

void EngineImpl::DrawOnHost(std::vector<SequenceLogits>& rows, absl::Time now) {
  std::vector<Sequence*> seqs(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) seqs[i] = Find(rows[i].id);
  // A request's first draw with n > 1 also draws its siblings' (Fork).
  const auto forks = [](const Sequence& seq) {
    return !seq.group().forked && seq.group().request.sampling.n > 1;
  };
  std::vector<SampleResult> drawn(rows.size());
  ParallelFor(static_cast<int64_t>(rows.size()), /*threads=*/0, [&](int64_t i) {
    if (seqs[i] != nullptr && !forks(*seqs[i])) drawn[i] = Draw(seqs[i], rows[i].logits);
  });
  for (size_t i = 0; i < rows.size(); ++i) {
    Sequence* seq = seqs[i];
    if (seq == nullptr) continue;
    if (forks(*seq)) {
      Advance(seq, std::move(rows[i].logits), now);
      continue;
    }
    Record(seq, std::move(drawn[i]), now);
    if (seq->output().finished()) Retire(seq);
  }
}

void EngineImpl::Advance(Sequence* seq, std::vector<float> logits, absl::Time now) {
  RequestGroup& group = seq->group();
  const SequenceId id = seq->id();
  const bool fork = !group.forked && group.request.sampling.n > 1;
  std::vector<float> raw;
  if (fork) raw = logits;
  Accept(seq, std::move(logits), now);
  if (fork) Fork(seq, raw, now);
  if (Sequence* s = Find(id); s != nullptr && s->output().finished()) Retire(s);
}

void EngineImpl::ScorePrompt(Sequence* seq, PromptLogits& prompt) {
  const std::vector<int32_t>& tokens = seq->group().request.prompt_tokens;
  const int top = seq->params().prompt_logprobs;
  const auto rows = static_cast<int>(prompt.logits.size() / vocab_size_);
  for (int r = 0; r < rows; ++r) {
    const std::span<float> row(prompt.logits.data() + static_cast<size_t>(r) * vocab_size_,
                               static_cast<size_t>(vocab_size_));
    seq->group().prompt_logprobs.push_back(
        ScoreToken(row, tokens[prompt.first_position + r + 1], top));
  }
}

void EngineImpl::Accept(Sequence* seq, std::vector<float> logits, absl::Time now) {
  Record(seq, Draw(seq, logits), now);
}

SampleResult EngineImpl::Draw(Sequence* seq, std::span<float> logits) const {
  KeepAllowedTokens(seq->params(), logits);
  if (seq->output().num_generated() < seq->params().min_tokens) {
    MaskStopTokens(seq->params(), eos_, logits);
  }
  return Sample(seq->params(), logits, seq->sampling());
}

void EngineImpl::Record(Sequence* seq, SampleResult sample, absl::Time now) {
  if (seq->at_first_sample() && seq->params().prompt_logprobs >= 0) {
    seq->output().SetPromptLogprobs(seq->group().prompt_logprobs);
  }
  seq->AppendToken(sample.token);
  ++generated_tokens_total_;
  touched_.insert(&seq->group());
  const bool stop = IsStopToken(seq->params(), eos_, sample.token);
  const bool done = seq->output().AddToken(sample.token, stop, std::move(sample.logprob), now);
  if (!done && max_context_ > 0 && seq->num_tokens() >= max_context_) {
    seq->output().Finish(FinishReason::kLength, absl::OkStatus(), now);
  }
}

// n > 1: each sibling samples its first token from the prompt's logits with
// its own RNG, then starts from a copy of the prompt's state.
void EngineImpl::Fork(Sequence* leader, const std::vector<float>& logits, absl::Time now) {
  RequestGroup& group = leader->group();
  group.forked = true;
  for (int i = 1; i < group.request.sampling.n; ++i) {
    auto child = std::make_unique<Sequence>(next_id_++, &group, i, group.request.prompt_tokens,
                                            leader->num_prompt_tokens(), "");
    Accept(child.get(), logits, now);
    if (child->output().finished()) continue;
    if (absl::Status s = scheduler_.AddForked(child.get(), *leader); !s.ok()) {
      Abort(&group, FinishReason::kError, s);
      return;
    }
    group.live.push_back(child.get());
    sequences_.emplace(child->id(), std::move(child));
  }
}

void EngineImpl::Retire(Sequence* seq) {
  scheduler_.Free(seq);
  std::vector<Sequence*>& live = seq->group().live;
  live.erase(std::find(live.begin(), live.end(), seq));
  sequences_.erase(seq->id());
}

void EngineImpl::Abort(RequestGroup* group, FinishReason reason, const absl::Status& status) {
  const absl::Time now = absl::Now();
  for (OutputProcessor& out : group->outputs) {
    if (!out.finished()) out.Finish(reason, status, now);
  }
  while (!group->live.empty()) Retire(group->live.back());
  touched_.insert(group);
}

Sequence* EngineImpl::Find(SequenceId id) {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

void EngineImpl::Emit() {
  for (RequestGroup* group : touched_) {
    for (OutputProcessor& out : group->outputs) {
      if (!out.has_output()) continue;
      RequestOutput output = out.TakeOutput();
      if (output.finished() && --group->unfinished == 0) {
        absl::MutexLock lock(&mu_);  // the id may be reused once its last output is out
        live_ids_.erase(group->request.request_id);
      }
      group->on_output(output);
    }
  }
  for (RequestGroup* group : touched_) {
    if (group->unfinished == 0) requests_.erase(group->request.request_id);
  }
  touched_.clear();
}

void EngineImpl::PublishStats() {
  absl::MutexLock lock(&mu_);
  stats_.running = scheduler_.num_running();
  stats_.waiting = scheduler_.num_waiting();
  stats_.slots_total = cache_->num_slots();
  stats_.slots_used = cache_->num_slots() - cache_->num_free();
  stats_.bytes_per_slot = cache_->bytes_per_slot();
  stats_.prompt_tokens_total = prompt_tokens_total_;
  stats_.generated_tokens_total = generated_tokens_total_;
  stats_.steps_total = steps_total_;
  stats_.preemptions_total = scheduler_.preemptions_total();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ModelRunner> runner,
                                                       const Tokenizer* tokenizer,
                                                       EngineConfig config) {
  if (runner == nullptr) return Invalid("runner", "must not be null");
  const std::pair<const char*, int64_t> positive[] = {
      {"max_batch_tokens", config.max_batch_tokens},
      {"max_running", config.max_running},
      {"max_waiting", config.max_waiting},
      {"max_prompt_tokens", config.max_prompt_tokens},
      {"max_new_tokens", config.max_new_tokens}};
  for (const auto& [field, value] : positive) {
    if (value < 1) return Invalid(field, absl::StrCat("must be at least 1, got ", value));
  }
  if (config.state_memory_bytes < 0) return Invalid("state_memory_bytes", "must be >= 0");
  if (config.preempt_quantum_tokens < 0) return Invalid("preempt_quantum_tokens", "must be >= 0");
  const int64_t budget =
      config.state_memory_bytes > 0 ? config.state_memory_bytes : runner->DefaultStateMemoryBytes();
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<StateCache> cache,
                        StateCache::Create(runner.get(), budget, config.max_running));
  return std::unique_ptr<Engine>(
      new EngineImpl(std::move(runner), tokenizer, config, std::move(cache)));
}

}  // namespace lair::engine
