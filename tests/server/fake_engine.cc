#include "tests/server/fake_engine.h"

#include <algorithm>
#include <random>

namespace lair::server::testing {
namespace {

constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz ";
constexpr int kAlphabetSize = 27;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// How many trailing bytes of `text` could start one of `stops`.
size_t HeldBack(const std::string& text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& stop : stops) {
    for (size_t len = std::min(stop.size() - 1, text.size()); len > held; --len) {
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        held = len;
        break;
      }
    }
  }
  return held;
}

}  // namespace

FakeEngine::FakeEngine(const Tokenizer* tokenizer, engine::EngineConfig config,
                       absl::Duration step_delay)
    : tokenizer_(tokenizer),
      config_(config),
      step_delay_(step_delay),
      thread_([this] { Loop(); }) {}

FakeEngine::~FakeEngine() { Shutdown(absl::ZeroDuration()); }

absl::Status FakeEngine::Submit(engine::EngineRequest request, engine::OutputCallback on_output) {
  const engine::SamplingParams& s = request.sampling;
  if (request.prompt_tokens.empty())
    return absl::InvalidArgumentError("prompt_tokens: empty prompt");
  if (static_cast<int>(request.prompt_tokens.size()) > config_.max_prompt_tokens) {
    return absl::InvalidArgumentError("prompt_tokens: longer than max_prompt_tokens");
  }
  if (s.n < 1) return absl::InvalidArgumentError("n: must be at least 1");
  if (s.max_tokens < 1 || s.max_tokens > config_.max_new_tokens) {
    return absl::InvalidArgumentError("max_tokens: must be in [1, " +
                                      std::to_string(config_.max_new_tokens) + "]");
  }
  if (s.temperature < 0) return absl::InvalidArgumentError("temperature: must be >= 0");
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) return absl::FailedPreconditionError("the engine is shutting down");
  if (running_.count(request.request_id) || queued_.count(request.request_id)) {
    return absl::InvalidArgumentError("request_id: duplicate");
  }
  if (static_cast<int>(waiting_.size()) >= config_.max_waiting) {
    return absl::ResourceExhaustedError("the request queue is full");
  }
  Live live;
  live.completions.resize(s.n);
  std::random_device device;
  for (int i = 0; i < s.n; ++i) {
    live.completions[i].context = request.prompt_tokens;
    live.completions[i].rng = s.seed ? *s.seed * 1000003ull + static_cast<uint64_t>(i) : device();
  }
  prompt_tokens_ += static_cast<int64_t>(request.prompt_tokens.size());
  std::string id = request.request_id;
  live.request = std::move(request);
  live.on_output = std::move(on_output);
  queued_.emplace(id, std::move(live));
  waiting_.push_back(id);
  wake_.notify_all();
  return absl::OkStatus();
}

void FakeEngine::Cancel(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(request_id);
  wake_.notify_all();
}

std::vector<FakeEngine::Delivery> FakeEngine::CancelLocked(const std::string& id) {
  std::vector<Delivery> deliveries;
  auto take = [&](std::map<std::string, Live>& from) {
    auto it = from.find(id);
    if (it == from.end()) return;
    Live& live = it->second;
    for (size_t i = 0; i < live.completions.size(); ++i) {
      if (live.completions[i].done) continue;
      engine::RequestOutput out;
      out.request_id = id;
      out.index = static_cast<int>(i);
      out.finish_reason = engine::FinishReason::kCancelled;
      out.usage = {static_cast<int>(live.request.prompt_tokens.size()),
                   live.completions[i].generated};
      deliveries.emplace_back(live.on_output, std::move(out));
    }
    from.erase(it);
  };
  take(running_);
  take(queued_);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  return deliveries;
}

engine::EngineStats FakeEngine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  engine::EngineStats stats;
  stats.running = static_cast<int>(running_.size());
  stats.waiting = static_cast<int>(waiting_.size());
  stats.slots_total = config_.max_running;
  stats.slots_used = static_cast<int>(running_.size());
  stats.bytes_per_slot = 4096;
  stats.prompt_tokens_total = prompt_tokens_;
  stats.generated_tokens_total = generated_tokens_;
  stats.steps_total = steps_;
  return stats;
}

void FakeEngine::Shutdown(absl::Duration grace) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    accepting_ = false;
    wake_.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(grace)),
                   [this] { return running_.empty() && waiting_.empty(); });
    for (const auto& [id, live] : running_) cancels_.push_back(id);
    for (const auto& [id, live] : queued_) cancels_.push_back(id);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

// Every callback runs here, on the engine thread, in order: cancellations
// first, then one step.
void FakeEngine::Loop() {
  while (true) {
    std::vector<Delivery> deliveries;
    bool stepped = false, stop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] {
        return stop_ || !running_.empty() || !waiting_.empty() || !cancels_.empty();
      });
      for (const std::string& id : cancels_) {
        for (Delivery& d : CancelLocked(id)) deliveries.push_back(std::move(d));
      }
      cancels_.clear();
      stop = stop_;
      if (!stop && (!running_.empty() || !waiting_.empty())) {
        for (Delivery& d : StepLocked()) deliveries.push_back(std::move(d));
        stepped = true;
      }
    }
    Deliver(deliveries);
    wake_.notify_all();
    if (stop) return;
    if (stepped)
      std::this_thread::sleep_for(
          std::chrono::microseconds(absl::ToInt64Microseconds(step_delay_)));
  }
}

std::vector<FakeEngine::Delivery> FakeEngine::StepLocked() {
  while (static_cast<int>(running_.size()) < config_.max_running && !waiting_.empty()) {
    std::string id = waiting_.front();
    waiting_.pop_front();
    running_.insert(queued_.extract(id));
  }
  ++steps_;
  std::vector<Delivery> deliveries;
  for (auto it = running_.begin(); it != running_.end();) {
    Live& live = it->second;
    bool all_done = true;
    for (size_t i = 0; i < live.completions.size(); ++i) {
      if (live.completions[i].done) continue;
      deliveries.emplace_back(live.on_output, Advance(live, static_cast<int>(i)));
      all_done = all_done && live.completions[i].done;
    }
    it = all_done ? running_.erase(it) : std::next(it);
  }
  return deliveries;
}

engine::RequestOutput FakeEngine::Advance(Live& live, int index) {
  const engine::SamplingParams& s = live.request.sampling;
  Completion& c = live.completions[index];
  const uint64_t last = static_cast<uint64_t>(c.context.back());
  const uint64_t pick =
      s.temperature == 0 ? last * 31 + c.context.size() * 7 : SplitMix(c.rng) + last;
  const int32_t token = static_cast<unsigned char>(kAlphabet[pick % kAlphabetSize]);
  c.context.push_back(token);
  ++c.generated;
  ++generated_tokens_;
  c.text += tokenizer_->Decode(std::span<const int32_t>(&token, 1), false);

  engine::RequestOutput out;
  out.request_id = live.request.request_id;
  out.index = index;
  out.new_tokens = {token};
  if (s.logprobs >= 0) {
    engine::TokenLogprob lp{token, -0.25f, {}};
    for (int k = 0, alt = 'a'; k < s.logprobs; ++alt) {
      if (k == 0) {
        lp.top.emplace_back(token, -0.25f);
      } else if (alt != token) {
        lp.top.emplace_back(alt, -1.0f - static_cast<float>(k));
      } else {
        continue;
      }
      ++k;
    }
    out.logprobs.push_back(lp);
  }
  if (c.generated == 1 && s.prompt_logprobs >= 0) {
    const std::vector<int32_t>& prompt = live.request.prompt_tokens;
    for (size_t p = 1; p < prompt.size(); ++p) {
      engine::TokenLogprob lp{prompt[p], -0.5f, {}};
      if (s.prompt_logprobs > 0) lp.top.emplace_back(prompt[p], -0.5f);
      out.prompt_logprobs.push_back(lp);
    }
  }
  size_t end = c.text.size() - HeldBack(c.text, s.stop);
  for (const std::string& stop : s.stop) {
    size_t at = c.text.find(stop);
    if (at != std::string::npos) {
      out.finish_reason = engine::FinishReason::kStop;
      out.stop_reason = stop;
      end = s.include_stop_str_in_output ? at + stop.size() : at;
      break;
    }
  }
  if (std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) !=
      s.stop_token_ids.end()) {
    out.finish_reason = engine::FinishReason::kStop;
    out.stop_reason = tokenizer_->IdToToken(token);
  }
  if (!out.finished() && c.generated >= s.max_tokens) {
    out.finish_reason = engine::FinishReason::kLength;
    end = c.text.size();
  }
  out.text_delta = c.text.substr(c.emitted, end > c.emitted ? end - c.emitted : 0);
  c.emitted = std::max(c.emitted, end);
  c.done = out.finished();
  out.usage = {static_cast<int>(live.request.prompt_tokens.size()), c.generated};
  return out;
}

void FakeEngine::Deliver(const std::vector<Delivery>& deliveries) {
  for (const auto& [callback, output] : deliveries) callback(output);
}

}  // namespace lair::server::testing
