#include "kernels/sampling.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace lair::kernels {
namespace {

// The first prefix of the ranking a top_p cut sorts; each next one is four
// times as long.
constexpr int32_t kFirstRanked = 256;

// Ascending keys give the ranking: s larger first, lower id first on ties
// (-0 and +0 tie, as they compare equal). The high word is s's bits made
// to order as integers, inverted; the low word the id.
uint64_t RankKey(float s, int32_t id) {
  const auto bits = std::bit_cast<uint32_t>(s + 0.0f);  // -0 + 0 = +0
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

// Sorts keys ascending, least significant byte first, each pass a stable
// counting sort (a pass whose byte every key shares is skipped): at tens of
// thousands of keys several times faster than std::sort.
void RadixSort(std::span<uint64_t> keys) {
  std::vector<uint64_t> buffer(keys.size());
  std::span<uint64_t> from = keys;
  std::span<uint64_t> to = buffer;
  for (int shift = 0; shift < 64; shift += 8) {
    std::array<size_t, 257> start{};
    for (uint64_t key : from) ++start[((key >> shift) & 0xff) + 1];
    if (std::find(start.begin() + 1, start.end(), from.size()) != start.end()) continue;
    std::partial_sum(start.begin(), start.end(), start.begin());
    for (uint64_t key : from) to[start[(key >> shift) & 0xff]++] = key;
    std::swap(from, to);
  }
  if (from.data() != keys.data()) std::copy(from.begin(), from.end(), keys.begin());
}

}  // namespace

int32_t SampleRow(std::span<const float> logits, const RowSampling& r, std::span<float> logprobs) {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (r.temperature == 0) {
    const auto token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (!logprobs.empty()) {
      if (logprobs.data() != logits.data())
        std::copy(logits.begin(), logits.end(), logprobs.begin());
      LogSoftmax(logprobs);
    }
    return token;
  }
  std::vector<float> s(logits.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = logits[i] / r.temperature;
  const float max_s = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double total = 0;
  for (size_t i = 0; i < s.size(); ++i) total += p[i] = std::exp(s[i] - max_s);
  int32_t keep = vocab;
  if (r.min_p > 0 || r.top_k > 0 || r.top_p < 1) {
    // Only the kept prefix of the ranking is needed: its set, and under
    // top_p its order, found in prefixes of growing length (a prefix of a
    // strict order's sort is the same whatever the length sorted), the
    // rest sorted at once when a prefix would reach an eighth of the
    // vocabulary. Tokens are ranked by one 64-bit key each (RankKey).
    if (r.min_p > 0) {
      // p falls along the ranking, so the tokens at or above the floor are
      // its first ones.
      const double floor = static_cast<double>(r.min_p);  // of max p, whose weight is 1
      keep = static_cast<int32_t>(
          std::count_if(p.begin(), p.end(), [&](double q) { return q >= floor; }));
      keep = std::max(keep, 1);
    }
    if (r.top_k > 0) keep = std::min(keep, r.top_k);
    std::vector<uint64_t> ranked(logits.size());
    for (int32_t i = 0; i < vocab; ++i) ranked[i] = RankKey(s[i], i);
    const auto token = [&](int32_t rank) {
      return static_cast<int32_t>(ranked[rank] & 0xffffffffu);
    };
    if (r.top_p < 1) {
      double mass = 0;
      int32_t n = 0;
      bool reached = false;
      // Each p is at most 1 (the top token's), so fewer than top_p · total
      // tokens cannot reach the mass: the first prefix is at least that long.
      const auto fewest = static_cast<int32_t>(std::min<double>(keep, r.top_p * total));
      for (int32_t sorted = 0; n < keep && !reached;) {
        int32_t more = std::min(keep, std::max({kFirstRanked, 4 * sorted, fewest}));
        if (more > vocab / 8) {
          RadixSort(std::span(ranked).subspan(sorted));
          more = keep;
        } else {
          std::partial_sort(ranked.begin() + sorted, ranked.begin() + more, ranked.end());
        }
        sorted = more;
        while (n < sorted && !reached) {
          mass += p[token(n++)] / total;
          reached = mass >= r.top_p;
        }
      }
      keep = n;
    } else if (keep < vocab) {
      std::nth_element(ranked.begin(), ranked.begin() + keep, ranked.end());
    }
    for (int32_t i = keep; i < vocab; ++i) p[token(i)] = -1;  // dropped
  }
  double kept_mass = 0;
  for (double q : p) kept_mass += q > 0 ? q : 0;
  // log(p / kept mass), with log p = s − max s (p's own exponent): no
  // logarithm a token.
  const double log_kept = std::log(kept_mass);
  for (size_t i = 0; i < logprobs.size(); ++i) {
    logprobs[i] = p[i] > 0 ? static_cast<float>(static_cast<double>(s[i] - max_s) - log_kept)
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

void LogSoftmax(std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) {
    if (l != kNegInf) sum += std::exp(static_cast<double>(l - max));
  }
  const float log_z = max + static_cast<float>(std::log(sum));
  for (float& l : logits) {
    if (l != kNegInf) l -= log_z;
  }
}

std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logprobs, int n) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < static_cast<int32_t>(logprobs.size()); ++i) {
    if (logprobs[i] != -std::numeric_limits<float>::infinity()) ids.push_back(i);
  }
  const size_t listed = std::min<size_t>(std::max(n, 0), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(listed), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logprobs[a] != logprobs[b] ? logprobs[a] > logprobs[b] : a < b;
                    });
  std::vector<std::pair<int32_t, float>> top;
  for (size_t i = 0; i < listed; ++i) top.emplace_back(ids[i], logprobs[ids[i]]);
  return top;
}

}  // namespace lair::kernels
