// OutputProcessor: one completion's output stream (engine -> front end).
//
// It turns generated tokens into RequestOutputs: incremental detokenization
// (IncrementalDecoder, special tokens skipped unless the request keeps them), stop strings matched
// across token boundaries, max_tokens, usage counts and timings.
//
// Before min_tokens tokens no stop string is matched (stop tokens cannot be
// sampled then: the engine masks them).
//
// Stop strings: text is held back while a suffix of it could still be the
// start of a stop string, so a match that spans several tokens is found and
// no text past it is ever sent. On a match the text before it is sent (plus
// the stop string itself when include_stop_str_in_output) and the completion
// finishes with kStop and stop_reason = the string. A stop token (EOS or
// stop_token_ids) is listed in new_tokens and counted in usage but its text
// is not sent; stop_reason is its id in decimal for stop_token_ids, empty
// for EOS.
//
// Thread safety: thread-compatible; owned by the engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "engine/request.h"
#include "engine/request_output.h"
#include "tokenizer/tokenizer.h"

namespace lair::engine {

class OutputProcessor {
 public:
  // `tokenizer` (may be null: no text) and `params` must outlive this.
  OutputProcessor(const Tokenizer* tokenizer, const SamplingParams* params, std::string request_id,
                  int index, int num_prompt_tokens, absl::Time arrival);

  // Records when the request was first scheduled (the end of its queue time).
  // Later calls are ignored.
  void MarkScheduled(absl::Time now);
  // Appends one generated token. `is_stop_token` says it is EOS or one of
  // stop_token_ids (see IsStopToken). Returns true when this token finished
  // the completion (stop token, stop string or max_tokens).
  // REQUIRES: !finished().
  bool AddToken(int32_t token, bool is_stop_token, std::optional<TokenLogprob> logprob,
                absl::Time now);
  // Sends the scored prompt (SamplingParams::prompt_logprobs) with the next
  // output: the completion's first.
  void SetPromptLogprobs(std::vector<TokenLogprob> prompt_logprobs);
  // Finishes the completion for a reason other than its tokens: kLength at
  // the model's context limit, kCancelled, or kError with `status`.
  // REQUIRES: !finished().
  void Finish(FinishReason reason, absl::Status status, absl::Time now);

  bool finished() const { return reason_ != FinishReason::kNone; }
  int num_generated() const { return num_generated_; }
  // Whether TakeOutput has something to send: new tokens, or the final
  // output not yet taken.
  bool has_output() const;
  // What is new since the last call; the final one carries the finish
  // reason and timings.
  RequestOutput TakeOutput();

 private:
  // Releases text up to any stop string (finishing on a match) or up to
  // the part that could still begin one. `final` releases everything.
  void ReleaseText(bool final);
  void SetFinished(FinishReason reason, absl::Time now);

  const SamplingParams* const params_;
  const std::string request_id_;
  const int index_;
  const int num_prompt_tokens_;
  const absl::Time arrival_;
  std::optional<IncrementalDecoder> decoder_;  // absent without a tokenizer

  std::string held_;       // decoded text not yet sent
  RequestOutput pending_;  // tokens, text and logprobs not yet taken
  int num_generated_ = 0;
  FinishReason reason_ = FinishReason::kNone;
  bool final_taken_ = false;

  std::optional<absl::Time> scheduled_at_;
  std::optional<absl::Time> first_token_at_;
  absl::Time last_token_at_;
  absl::Time finished_at_;
};

}  // namespace lair::engine
