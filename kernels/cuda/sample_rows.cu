// Row sampling on the device, by kernels/sampling.h's rules: one block of
// 1024 threads a row, so a step downloads B token ids, not B × vocab logits.
//
// With s = logits / T and p = expf(s − max s) (max p = 1; sums in double, as
// the CPU reference):
//   - min_p and top_k give counts directly (p ≥ min_p; k).
//   - top_p bisects the float order of s for t_p, the largest value whose
//     "p of every token ≥ t_p" reaches top_p · Σp; the ties at t_p then add
//     as few tokens as reach it.
//   - otherwise the kept count n bisects for c, the n-th largest value.
//     The kept tokens are those above the cut and the first ties at it by id.
//   - the draw: thread t owns ids [t·chunk, (t+1)·chunk); a block prefix sum
//     of the kept p per chunk finds the chunk holding u · Σkept p, and its
//     thread walks it.
// A bisection step is one pass over the row (from shared memory when the
// row fits) and a block reduction: top_p costs about 35 passes, top_k or
// min_p alone about 33 (counts only, no exponentials), no filter 4. A radix
// select on 4-bit digits (8 passes of shared-atomic tallies) measured
// slower, its atomics colliding where most keys share their top digits.
//
// Logprobs (RowSampling::logprobs = n >= 0): each listed token is found by
// one more pass, the largest (logprob, lower id) below the last one listed
// among the tokens the draw could take (ListLogprobs).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <set>

#include "kernels/cuda/sample_rows.h"

namespace lair::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxStagedVocab = (160 << 10) / sizeof(float);

// Unsigned keys in the order of the floats (−0 and +0 one key, as they
// compare equal; no NaN expected).
__device__ __forceinline__ uint32_t Key(float x) {
  const uint32_t bits = x == 0.0f ? 0u : __float_as_uint(x);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

__device__ __forceinline__ float FromKey(uint32_t key) {
  return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

// Shared memory for one block reduction or scan of each type.
template <typename T>
struct Lanes {
  T warps[kWarps];
  T result;
};

struct Scratch {
  Lanes<double> d;
  Lanes<float> f;
  Lanes<int64_t> i;
  Lanes<uint64_t> u;
};

// A block-wide reduction by `op` (associative; applied in a fixed order, so
// the result is the same every run): every thread gets the result.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, Lanes<T>& lanes) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) lanes.warps[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lanes.warps[lane];
    for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (lane == 0) lanes.result = w;
  }
  __syncthreads();
  const T out = lanes.result;
  __syncthreads();
  return out;
}

__device__ double BlockSum(double v, Scratch& sh) {
  return BlockReduce(
      v, [](double a, double b) { return a + b; }, sh.d);
}
__device__ int64_t BlockCount(int64_t v, Scratch& sh) {
  return BlockReduce(
      v, [](int64_t a, int64_t b) { return a + b; }, sh.i);
}
__device__ float BlockMax(float v, Scratch& sh) {
  return BlockReduce(
      v, [](float a, float b) { return fmaxf(a, b); }, sh.f);
}
__device__ uint64_t BlockMaxKey(uint64_t v, Scratch& sh) {
  return BlockReduce(
      v, [](uint64_t a, uint64_t b) { return a > b ? a : b; }, sh.u);
}

// The sum of v over threads before this one (an exclusive block scan), and
// the total in *total; `lanes` is the scratch of T.
template <typename T>
__device__ T BlockExclusiveSum(T v, Lanes<T>& lanes, T* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  if (lane == 31) lanes.warps[warp] = inclusive;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? lanes.warps[w] : T(0);
    all += lanes.warps[w];
  }
  __syncthreads();
  *total = all;
  return before + inclusive - v;
}

// Writes a draw's logprobs (Backend::SampleRows' layout) for row `row`:
// the drawn token's, then the n likeliest by logprob(j) among the tokens
// where listable(j, tied) holds, `tied` being how many of those listed so
// far are at the kept cut (at_cut(j)), whose first ties by id alone are
// kept: as they share one logprob, they are listed in id order. Each pass
// finds the largest key (Key(logprob), then the inverted id) below the
// last one listed.
template <typename Logprob, typename Listable, typename AtCut>
__device__ void ListLogprobs(int64_t vocab, int n, int32_t drawn, Logprob logprob,
                             Listable listable, AtCut at_cut, float* values, int32_t* top_ids,
                             Scratch& sh) {
  float* out = values + blockIdx.x * static_cast<int64_t>(1 + kMaxRowLogprobs);
  int32_t* ids = top_ids + blockIdx.x * static_cast<int64_t>(kMaxRowLogprobs);
  uint64_t last = ~uint64_t{0};
  int64_t tied = 0;
  int listed = 0;
  for (; listed < n; ++listed) {
    uint64_t best = 0;
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      if (!listable(j, tied)) continue;
      const uint64_t key =
          (static_cast<uint64_t>(Key(logprob(j))) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
      if (key < last && key > best) best = key;
    }
    best = BlockMaxKey(best, sh);
    if (best == 0) break;
    last = best;
    const auto j = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(best));
    tied += at_cut(j) ? 1 : 0;
    if (threadIdx.x == 0) {
      ids[listed] = j;
      out[1 + listed] = logprob(j);
    }
  }
  if (threadIdx.x == 0) {
    out[0] = logprob(drawn);
    for (int i = listed; i < kMaxRowLogprobs; ++i) {
      ids[i] = -1;
      out[1 + i] = -INFINITY;
    }
  }
}

// One row's scaled logits s, from shared memory when staged.
struct Row {
  const float* logits;
  const float* staged;  // null when the row is read from global memory
  float temperature;
  __device__ float s(int64_t i) const { return staged ? staged[i] : logits[i] / temperature; }
};

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* logits, int64_t vocab, const RowSampling* params, int32_t* ids,
                     float* logprobs, int32_t* top_ids) {
  extern __shared__ float staged[];
  __shared__ Scratch sh;
  __shared__ int32_t found;      // the drawn token, or INT32_MAX
  __shared__ int32_t last_kept;  // the largest kept id
  const RowSampling r = params[blockIdx.x];
  const float* in = logits + blockIdx.x * vocab;
  const int tid = threadIdx.x;

  if (r.temperature == 0) {  // the first maximum
    float best = -FLT_MAX;
    int64_t best_i = vocab;
    for (int64_t j = tid; j < vocab; j += kThreads) {
      if (in[j] > best) best = in[j], best_i = j;
    }
    const float top = BlockMax(best, sh);
    if (tid == 0) found = INT32_MAX;
    __syncthreads();
    if (best == top && best_i < vocab) atomicMin(&found, static_cast<int32_t>(best_i));
    __syncthreads();
    const int32_t token = found < vocab ? found : 0;
    if (tid == 0) ids[blockIdx.x] = token;
    if (r.logprobs < 0) return;
    // The log-softmax of the logits, as kernels::LogSoftmax forms it.
    double z = 0;
    for (int64_t j = tid; j < vocab; j += kThreads) {
      if (in[j] != -INFINITY) z += exp(static_cast<double>(in[j] - top));
    }
    const float log_z = top + static_cast<float>(log(BlockSum(z, sh)));
    ListLogprobs(
        vocab, r.logprobs, token, [&](int64_t j) { return in[j] - log_z; },
        [&](int64_t j, int64_t) { return in[j] != -INFINITY; }, [](int64_t) { return false; },
        logprobs, top_ids, sh);
    return;
  }

  const bool stage = vocab <= kMaxStagedVocab;
  if (stage) {
    for (int64_t j = tid; j < vocab; j += kThreads) staged[j] = in[j] / r.temperature;
    __syncthreads();
  }
  const Row row{in, stage ? staged : nullptr, r.temperature};
  float local_max = -FLT_MAX;
  for (int64_t j = tid; j < vocab; j += kThreads) local_max = fmaxf(local_max, row.s(j));
  const float max_s = BlockMax(local_max, sh);
  const auto p = [&](int64_t j) { return static_cast<double>(expf(row.s(j) - max_s)); };
  const auto mass_from = [&](uint32_t key) {  // Σp over tokens with Key(s) ≥ key
    double m = 0;
    for (int64_t j = tid; j < vocab; j += kThreads) m += Key(row.s(j)) >= key ? p(j) : 0.0;
    return BlockSum(m, sh);
  };
  const auto count_from = [&](uint32_t key) {  // tokens with Key(s) ≥ key
    int64_t n = 0;
    for (int64_t j = tid; j < vocab; j += kThreads) n += Key(row.s(j)) >= key;
    return BlockCount(n, sh);
  };
  // The largest key in [lo, hi] where pred holds (pred(lo) must hold).
  const auto largest_key = [&](uint32_t lo, uint32_t hi, auto pred) {
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      if (pred(mid)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };

  const bool filtered = r.min_p > 0 || r.top_k > 0 || r.top_p < 1;
  uint32_t cut = 0;      // kept: Key(s) > cut, or == cut among the first `ties` by id
  int64_t ties = vocab;  // with cut 0 every token is kept
  if (filtered) {
    int64_t keep = vocab;
    bool cut_known = false;
    if (r.min_p > 0) {
      int64_t n = 0;
      for (int64_t j = tid; j < vocab; j += kThreads) n += p(j) >= static_cast<double>(r.min_p);
      const int64_t at_least = BlockCount(n, sh);
      keep = at_least > 1 ? at_least : 1;
    }
    if (r.top_k > 0 && r.top_k < keep) keep = r.top_k;
    const uint32_t top_key = Key(max_s);
    if (r.top_p < 1) {
      double total = 0;
      for (int64_t j = tid; j < vocab; j += kThreads) total += p(j);
      const double goal = static_cast<double>(r.top_p) * BlockSum(total, sh);
      const uint32_t t = largest_key(0, top_key, [&](uint32_t k) { return mass_from(k) >= goal; });
      const double above = t < top_key ? mass_from(t + 1) : 0.0;
      const int64_t above_n = t < top_key ? count_from(t + 1) : 0;
      const int64_t equal_n = count_from(t) - above_n;
      const double each = static_cast<double>(expf(FromKey(t) - max_s));  // t is a token's s
      int64_t need = each > 0 ? static_cast<int64_t>(ceil((goal - above) / each)) : equal_n;
      need = need < 1 ? 1 : (need > equal_n ? equal_n : need);
      if (above_n + need <= keep) {  // top_p decides: its cut is known
        keep = above_n + need;
        cut = t;
        ties = need;
        cut_known = true;
      }
    }
    if (!cut_known) {  // min_p or top_k decides: find the keep-th largest value
      cut = largest_key(0, top_key, [&](uint32_t k) { return count_from(k) >= keep; });
      ties = keep - (cut < top_key ? count_from(cut + 1) : 0);
    }
  }

  // The draw over contiguous chunks of ids.
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t begin = tid * chunk < vocab ? tid * chunk : vocab;
  const int64_t end = begin + chunk < vocab ? begin + chunk : vocab;
  int64_t my_ties = 0;
  for (int64_t j = begin; j < end; ++j) my_ties += Key(row.s(j)) == cut;
  int64_t all_ties = 0;
  const int64_t ties_before = BlockExclusiveSum(my_ties, sh.i, &all_ties);
  const auto kept = [&](int64_t j, int64_t* tie_rank) {
    const uint32_t k = Key(row.s(j));
    if (k > cut) return true;
    if (k < cut) return false;
    return (*tie_rank)++ < ties;
  };
  double my_mass = 0;
  int64_t last = -1;
  int64_t rank = ties_before;
  for (int64_t j = begin; j < end; ++j) {
    if (kept(j, &rank)) my_mass += p(j), last = j;
  }
  double kept_mass = 0;
  const double before = BlockExclusiveSum(my_mass, sh.d, &kept_mass);
  const double target = r.u * kept_mass;
  if (tid == 0) found = INT32_MAX, last_kept = -1;
  __syncthreads();
  if (before <= target && target < before + my_mass) {
    double sum = before;
    rank = ties_before;
    for (int64_t j = begin; j < end; ++j) {
      if (!kept(j, &rank)) continue;
      sum += p(j);
      if (target < sum) {
        atomicMin(&found, static_cast<int32_t>(j));
        break;
      }
    }
  }
  if (last >= 0) atomicMax(&last_kept, static_cast<int32_t>(last));
  __syncthreads();
  // Rounding may leave the target past every chunk: then the last kept token.
  const int32_t token = found != INT32_MAX ? found : (last_kept >= 0 ? last_kept : 0);
  if (tid == 0) ids[blockIdx.x] = token;
  if (r.logprobs < 0) return;
  // A kept token's logprob is log(p / kept mass) = (s − max s) − log(kept
  // mass), as SampleRow forms it; tokens whose p is 0 are not listed.
  const double log_kept = log(kept_mass);
  ListLogprobs(
      vocab, r.logprobs, token,
      [&](int64_t j) {
        return static_cast<float>(static_cast<double>(row.s(j) - max_s) - log_kept);
      },
      [&](int64_t j, int64_t tied) {
        const uint32_t k = Key(row.s(j));
        return (k > cut || (k == cut && tied < ties)) && p(j) > 0;
      },
      [&](int64_t j) { return Key(row.s(j)) == cut; }, logprobs, top_ids, sh);
}

// Lets SampleRowsKernel stage any row up to kMaxStagedVocab on the current
// device: once a device, not at every launch.
cudaError_t AllowStagedRows() {
  static std::mutex mu;
  static auto* allowed = new std::set<int>();
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const std::lock_guard<std::mutex> lock(mu);
  if (allowed->contains(device)) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(SampleRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kMaxStagedVocab * sizeof(float)));
  if (e == cudaSuccess) allowed->insert(device);
  return e;
}

}  // namespace

cudaError_t LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab,
                             const RowSampling* params, int32_t* ids, float* logprobs,
                             int32_t* top_ids, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const size_t smem = vocab <= kMaxStagedVocab ? static_cast<size_t>(vocab) * sizeof(float) : 0;
  if (smem > 48 << 10) {
    if (const cudaError_t e = AllowStagedRows(); e != cudaSuccess) return e;
  }
  SampleRowsKernel<<<static_cast<unsigned>(rows), kThreads, smem, stream>>>(logits, vocab, params,
                                                                            ids, logprobs, top_ids);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
