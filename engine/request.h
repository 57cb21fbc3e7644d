// EngineRequest: what a front end hands the engine. One plain struct per
// crossing (front end -> engine); the engine never sees protocol types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lair::engine {

// Sampling and stopping parameters, with OpenAI's meanings and defaults.
struct SamplingParams {
  int n = 1;            // completions sharing one prefill
  int max_tokens = 16;  // generated tokens per completion
  // EOS, stop_token_ids and stop strings end no completion before it has
  // this many tokens (vLLM's min_tokens): stop tokens are masked until then.
  int min_tokens = 0;
  float temperature = 1.0f;                // 0 = greedy
  float top_p = 1.0f;                      // nucleus mass kept, (0, 1]
  int top_k = 0;                           // 0 = off
  float min_p = 0.0f;                      // drop tokens below min_p * max prob; 0 = off
  float repetition_penalty = 1.0f;         // >1 discourages tokens already seen (prompt and output)
  float presence_penalty = 0.0f;           // subtracted once from tokens already generated
  float frequency_penalty = 0.0f;          // subtracted per occurrence in the output
  std::map<int32_t, float> logit_bias;     // token id -> added to the logit
  std::optional<uint64_t> seed;            // same seed + prompt => same output, whatever the batch
  std::vector<int32_t> stop_token_ids;     // in addition to the tokenizer's EOS
  std::vector<int32_t> allowed_token_ids;  // not empty: only these can be sampled (vLLM's)
  std::vector<std::string> stop;           // stop strings, matched across token boundaries
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // leave special tokens out of the output text
  int logprobs = -1;                // -1: none; 0: chosen token only; N: top N alternatives too
  // -1: none; N >= 0: every prompt token after the first with its logprob
  // given the tokens before it, and the top N alternatives.
  int prompt_logprobs = -1;
};

struct EngineRequest {
  std::string request_id;              // unique among live requests
  std::vector<int32_t> prompt_tokens;  // already tokenized, BOS included if wanted
  SamplingParams sampling;
};

}  // namespace lair::engine
