#include "engine/output_processor.h"

#include <algorithm>
#include <utility>

namespace lair::engine {

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, const SamplingParams* params,
                                 std::string request_id, int index, int num_prompt_tokens,
                                 absl::Time arrival)
    : params_(params),
      request_id_(std::move(request_id)),
      index_(index),
      num_prompt_tokens_(num_prompt_tokens),
      arrival_(arrival) {
  if (tokenizer != nullptr) decoder_.emplace(*tokenizer, params->skip_special_tokens);
}

void OutputProcessor::MarkScheduled(absl::Time now) {
  if (!scheduled_at_.has_value()) scheduled_at_ = now;
}

bool OutputProcessor::AddToken(int32_t token, bool is_stop_token,
                               std::optional<TokenLogprob> logprob, absl::Time now) {
  LAIR_CHECK(!finished());
  ++num_generated_;
  if (!first_token_at_.has_value()) first_token_at_ = now;
  last_token_at_ = now;
  pending_.new_tokens.push_back(token);
  if (logprob.has_value()) pending_.logprobs.push_back(std::move(*logprob));
  if (is_stop_token) {
    if (std::find(params_->stop_token_ids.begin(), params_->stop_token_ids.end(), token) !=
        params_->stop_token_ids.end()) {
      pending_.stop_reason = std::to_string(token);
    }
    SetFinished(FinishReason::kStop, now);
    ReleaseText(/*final=*/true);
    return true;
  }
  if (decoder_.has_value()) held_ += decoder_->Add(token);
  const bool at_length = num_generated_ >= params_->max_tokens;
  ReleaseText(/*final=*/at_length);
  if (finished()) {  // a stop string matched
    finished_at_ = now;
    return true;
  }
  if (at_length) {
    SetFinished(FinishReason::kLength, now);
    return true;
  }
  return false;
}

void OutputProcessor::SetPromptLogprobs(std::vector<TokenLogprob> prompt_logprobs) {
  pending_.prompt_logprobs = std::move(prompt_logprobs);
}

void OutputProcessor::Finish(FinishReason reason, absl::Status status, absl::Time now) {
  LAIR_CHECK(!finished() && reason != FinishReason::kNone && reason != FinishReason::kStop);
  pending_.status = std::move(status);
  SetFinished(reason, now);
  if (reason == FinishReason::kLength) ReleaseText(/*final=*/true);
}

void OutputProcessor::SetFinished(FinishReason reason, absl::Time now) {
  reason_ = reason;
  finished_at_ = now;
}

void OutputProcessor::ReleaseText(bool final) {
  if (final && decoder_.has_value()) held_ += decoder_->Flush();
  // The earliest complete stop string wins, once min_tokens are out.
  size_t match_at = std::string::npos;
  const std::string* match = nullptr;
  if (num_generated_ >= params_->min_tokens) {
    for (const std::string& stop : params_->stop) {
      const size_t at = held_.find(stop);
      if (at < match_at) {
        match_at = at;
        match = &stop;
      }
    }
  }
  if (match != nullptr) {
    pending_.text_delta += held_.substr(0, match_at);
    if (params_->include_stop_str_in_output) pending_.text_delta += *match;
    pending_.stop_reason = *match;
    held_.clear();
    if (!finished()) reason_ = FinishReason::kStop;
    return;
  }
  size_t keep = 0;  // longest suffix of held_ that is a proper prefix of a stop string
  if (!final) {
    for (const std::string& stop : params_->stop) {
      for (size_t len = std::min(stop.size() - 1, held_.size()); len > keep; --len) {
        if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
  }
  pending_.text_delta += held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
}

bool OutputProcessor::has_output() const {
  return !pending_.new_tokens.empty() || (finished() && !final_taken_);
}

RequestOutput OutputProcessor::TakeOutput() {
  RequestOutput out = std::move(pending_);
  pending_ = RequestOutput();
  out.request_id = request_id_;
  out.index = index_;
  out.usage.prompt_tokens = num_prompt_tokens_;
  out.usage.completion_tokens = num_generated_;
  out.finish_reason = reason_;
  if (finished()) {
    final_taken_ = true;
    RequestTimings& t = out.timings;
    t.queue_seconds = absl::ToDoubleSeconds(scheduled_at_.value_or(finished_at_) - arrival_);
    if (first_token_at_.has_value()) {
      t.first_token_seconds = absl::ToDoubleSeconds(*first_token_at_ - arrival_);
      if (num_generated_ > 1) {
        t.mean_inter_token_seconds =
            absl::ToDoubleSeconds(last_token_at_ - *first_token_at_) / (num_generated_ - 1);
      }
    }
    t.total_seconds = absl::ToDoubleSeconds(finished_at_ - arrival_);
  }
  return out;
}

}  // namespace lair::engine
