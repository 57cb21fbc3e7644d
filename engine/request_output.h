// RequestOutput: what the engine streams back to a front end (engine -> front
// end crossing). Each carries only what is new since the previous one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace lair::engine {

enum class FinishReason {
  kNone,       // not finished
  kStop,       // EOS, a stop token or a stop string
  kLength,     // max_tokens reached
  kCancelled,  // the client cancelled or disconnected
  kError,      // see RequestOutput::status
};
// "stop", "length", "cancelled", "error" (OpenAI's spelling where it has one).
const char* FinishReasonName(FinishReason reason);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // top alternatives, best first
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

struct RequestTimings {
  double queue_seconds = 0;        // arrival to first scheduled
  double first_token_seconds = 0;  // arrival to first generated token
  double mean_inter_token_seconds = 0;
  double total_seconds = 0;  // arrival to finish
};

struct RequestOutput {
  std::string request_id;
  int index = 0;                       // which of the n completions
  std::vector<int32_t> new_tokens;     // tokens since the last output
  std::string text_delta;              // their text (never splits a UTF-8 character)
  std::vector<TokenLogprob> logprobs;  // one per new token when requested
  // In a completion's first output, when SamplingParams::prompt_logprobs
  // asks: prompt tokens 1 to P - 1, each scored given those before it.
  std::vector<TokenLogprob> prompt_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;  // the stop string or token that ended it, if any
  absl::Status status;      // error detail when finish_reason == kError
  Usage usage;              // running totals for this completion
  RequestTimings timings;   // filled on the final output
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace lair::engine
