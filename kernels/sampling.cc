#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace lair::kernels {

int32_t SampleRow(std::span<const float> logits, const RowSampling& r, std::span<float> logprobs) {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (r.temperature == 0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<float> s(logits.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = logits[i] / r.temperature;
  const float max_s = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double total = 0;
  for (size_t i = 0; i < s.size(); ++i) total += p[i] = std::exp(s[i] - max_s);
  int32_t keep = vocab;
  if (r.min_p > 0 || r.top_k > 0 || r.top_p < 1) {
    std::vector<int32_t> ranked(logits.size());
    std::iota(ranked.begin(), ranked.end(), 0);
    std::sort(ranked.begin(), ranked.end(),
              [&](int32_t a, int32_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
    if (r.min_p > 0) {
      const double floor = static_cast<double>(r.min_p);  // of max p, whose weight is 1
      while (keep > 1 && p[ranked[keep - 1]] < floor) --keep;
    }
    if (r.top_k > 0) keep = std::min(keep, r.top_k);
    if (r.top_p < 1) {
      double mass = 0;
      int32_t n = 0;
      while (n < keep) {
        mass += p[ranked[n++]] / total;
        if (mass >= r.top_p) break;
      }
      keep = n;
    }
    for (int32_t i = keep; i < vocab; ++i) p[ranked[i]] = -1;  // dropped
  }
  double kept_mass = 0;
  for (double q : p) kept_mass += q > 0 ? q : 0;
  for (size_t i = 0; i < logprobs.size(); ++i) {
    logprobs[i] = p[i] > 0 ? static_cast<float>(std::log(p[i] / kept_mass))
                           : -std::numeric_limits<float>::infinity();
  }
  const double target = r.u * kept_mass;
  double sum = 0;
  int32_t last = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (p[i] < 0) continue;
    sum += p[i];
    last = i;
    if (target < sum) return i;
  }
  return last;
}

}  // namespace lair::kernels
