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
#pragma once

#include <cstdint>
#include <span>

namespace lair::kernels {

struct RowSampling {
  float temperature = 0;  // 0: greedy
  int32_t top_k = 0;      // 0: off
  float top_p = 1;        // 1: off
  float min_p = 0;        // 0: off
  double u = 0;           // the draw, uniform in [0, 1); unused when greedy
};

// The token RowSampling's rules give for `logits` ([vocab], not empty).
// With `logprobs` ([vocab]; it may be `logits` itself) and temperature > 0,
// also writes the distribution the draw took: each kept token's log p over
// the kept tokens' p, -inf for the others.
int32_t SampleRow(std::span<const float> logits, const RowSampling& r,
                  std::span<float> logprobs = {});

}  // namespace lair::kernels
