// The segmented scan's sequential pieces (scan_segments.h): the segments'
// layout; then each segment's summed log decays, and S_{g+1} = D_g ⊙ S_g +
// F_g walked per state entry.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scan_segments.h"

namespace lair::kernels::cuda {
namespace {

constexpr int kSumFeatures = 32;  // features per block of the decay sums (one per lane)
constexpr int kSumRows = 32;      // token lanes per feature
constexpr int kCarryThreads = 256;

// One thread lays the segments out: each sequence's tokens cut into spans
// of `span` (its last one shorter). Few sequences take this schedule.
__global__ void SegmentOffsetsKernel(const int32_t* cu_seqlens, int num_seqs, int span,
                                     int32_t* segment_cu, int32_t* seq_segments) {
  int segments = 0;
  segment_cu[0] = 0;
  seq_segments[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int32_t end = cu_seqlens[s + 1];
    for (int32_t t = cu_seqlens[s]; t < end; t += span) segment_cu[++segments] = min(t + span, end);
    seq_segments[s + 1] = segments;
  }
}

// The features whose log decays a segment sums: the left gate's (every key,
// or one value for a scalar decay), then the right gate's columns; none for
// an absent gate.
struct DecayFeatures {
  int left, right;
  __host__ __device__ explicit DecayFeatures(const SegmentCarryParams& p)
      : left(p.left.ptr ? (p.left_vector ? p.dk : 1) : 0), right(p.right.ptr ? p.dv : 0) {}
  __host__ __device__ int width() const { return left + right; }
};

// decay_sums[g, h, f] = Σ_{t ∈ g} of feature f's log decay (DecayFeatures);
// grid (features / 32, H, segments).
__global__ void SegmentDecaySumsKernel(const SegmentCarryParams p) {
  __shared__ float part[kSumRows][kSumFeatures + 1];
  const DecayFeatures features(p);
  const int f = blockIdx.x * kSumFeatures + threadIdx.x, h = blockIdx.y, g = blockIdx.z;
  const int64_t bos = p.segment_cu[g];
  const int len = p.segment_cu[g + 1] - static_cast<int>(bos);
  float sum = 0.0f;
  if (f < features.width()) {
    const bool left = f < features.left;
    const LogGate& gate = left ? p.left : p.right;
    const int feature = left ? f : f - features.left;
    // Independent loads in flight: a segment is hundreds of tokens.
#pragma unroll 4
    for (int t = threadIdx.y; t < len; t += kSumRows) sum += GateAt(gate, bos, len, t, h, feature);
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || f >= features.width()) return;
  for (int r = 1; r < kSumRows; ++r) sum += part[r][threadIdx.x];
  p.decay_sums[(static_cast<int64_t>(g) * p.heads + h) * features.width() + f] = sum;
}

// One thread per state entry (h, a, e) of sequence blockIdx.y, in order over
// its segments.
__global__ void CarryKernel(const SegmentCarryParams p) {
  const int64_t per_seq = static_cast<int64_t>(p.heads) * p.dk * p.dv;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kCarryThreads) + threadIdx.x;
  if (i >= per_seq) return;
  const int s = blockIdx.y;
  const int e = i % p.dv, a = (i / p.dv) % p.dk, h = i / (static_cast<int64_t>(p.dv) * p.dk);
  const int64_t in_head = static_cast<int64_t>(h) * p.dk * p.dv;
  auto at = [&](const StateRef& r) {
    const int slot = r.slot ? r.slot[s] : s;
    return slot * r.slot_stride + in_head + static_cast<int64_t>(a) * r.stride_a +
           static_cast<int64_t>(e) * r.stride_b;
  };
  const DecayFeatures features(p);
  const int left_feature = p.left_vector ? a : 0;
  float state = p.s_init.ptr ? p.s_init.ptr[at(p.s_init)] : 0.0f;
  for (int g = p.seq_segments[s]; g < p.seq_segments[s + 1]; ++g) {
    const int64_t off = g * per_seq + i;
    p.entering[off] = state;
    const float* sums = p.decay_sums + (static_cast<int64_t>(g) * p.heads + h) * features.width();
    const float log_decay = (features.left ? sums[left_feature] : 0.0f) +
                            (features.right ? sums[features.left + e] : 0.0f);
    state = expf(log_decay) * state + p.local_final[off];
  }
  if (p.s_final.ptr) p.s_final.ptr[at(p.s_final)] = state;
}

}  // namespace

cudaError_t LaunchSegmentOffsets(const int32_t* cu_seqlens, int num_seqs, int span,
                                 int32_t* segment_cu, int32_t* seq_segments, cudaStream_t stream) {
  if (span <= 0) return cudaErrorInvalidValue;
  SegmentOffsetsKernel<<<1, 1, 0, stream>>>(cu_seqlens, num_seqs, span, segment_cu, seq_segments);
  return cudaGetLastError();
}

cudaError_t LaunchCarrySegmentStates(const SegmentCarryParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  if (p.left.shift || p.right.shift) return cudaErrorInvalidValue;  // segments would cut them
  if (const int width = DecayFeatures(p).width(); p.segments > 0 && width > 0) {
    const dim3 grid((width + kSumFeatures - 1) / kSumFeatures, p.heads, p.segments);
    SegmentDecaySumsKernel<<<grid, dim3(kSumFeatures, kSumRows), 0, stream>>>(p);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  const int64_t per_seq = static_cast<int64_t>(p.heads) * p.dk * p.dv;
  const dim3 grid(static_cast<unsigned>((per_seq + kCarryThreads - 1) / kCarryThreads), p.num_seqs);
  CarryKernel<<<grid, kCarryThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
