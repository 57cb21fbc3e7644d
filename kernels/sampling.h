// One row's draw from next-token logits, as the backends' SampleRows makes
// it: the semantics the CPU reference (SampleRow) and the CUDA kernel share,
// and the engine's host sampler follows for requests it keeps on the host.
//
// With temperature 0 the token is the first maximum. Otherwise, with
// s = logits / temperature and p = softmax(s) over the whole vocabulary
// (each exp(s − max s) in float, summed in double):
//   1. rank tokens by s, larger first, lower id first on ties;
//   2. keep the top n of that ranking, n the smallest of: the tokens with
//      p >= min_p · max p (min_p > 0), top_k (> 0), and the fewest top tokens
//      whose p sum to top_p or more (top_p < 1); at least one;
//   3. walk the kept tokens in id order, summing p, and take the first whose
//      sum exceeds u · (the kept tokens' p sum); the last kept token if
//      rounding leaves none.
// Walking in id order (not ranked order) lets a GPU find the token with one
// prefix sum instead of a sort; any fixed order draws from the same
// distribution.
//
// A draw's logprobs (RowSampling::logprobs >= 0) are those of the
// distribution it drew from: greedy, the log-softmax of the logits; else
// each kept token's log(p / the kept tokens' p sum), and -inf for the
// others. The drawn token's, and the `logprobs` likeliest tokens' (never a
// -inf one), best first, lower id first on ties.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace lair::kernels {

// How many of the likeliest tokens a draw lists with its logprobs, at most.
inline constexpr int kMaxRowLogprobs = 20;

struct RowSampling {
  float temperature = 0;  // 0: greedy
  int32_t top_k = 0;      // 0: off
  float top_p = 1;        // 1: off
  float min_p = 0;        // 0: off
  double u = 0;           // the draw, uniform in [0, 1); unused when greedy
  int32_t logprobs = -1;  // -1: none; else list this many (up to kMaxRowLogprobs)
};

// The token RowSampling's rules give for `logits` ([vocab], not empty).
// With `logprobs` ([vocab]; it may be `logits` itself) also writes the
// distribution the draw took: greedy, the log-softmax of the logits; else
// each kept token's log p over the kept tokens' p, -inf for the others.
int32_t SampleRow(std::span<const float> logits, const RowSampling& r,
                  std::span<float> logprobs = {});

// In place: logits → their log-softmax (entries at -inf stay -inf).
void LogSoftmax(std::span<float> logits);

// The `n` likeliest entries of a row of logprobs, as (id, logprob), best
// first, lower id first on ties; -inf entries are never listed.
std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logprobs, int n);

}  // namespace lair::kernels
