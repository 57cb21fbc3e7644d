// The sequential pieces of the segmented forward scan (cuda_backend.cc,
// ScanSchedule kSegmented): laying the segments out, and the carry. A long
// prompt's scan walks its chunks in order, one CTA per (sequence, head,
// tile): a prefill of one sequence leaves most multiprocessors idle. Split
// into segments of whole chunks, every segment's state pass runs at once
// from a zero state, giving its local final state F_g. Because the
// recurrence is linear in the state,
//   S_0 = s_init,  S_{g+1} = D_g ⊙ S_g + F_g,
//   D_g[a, e] = exp(Σ_{t ∈ g} left_t[a] + right_t[e]),
// and this carry is all that stays sequential: elementwise over the state,
// one step per segment. The one-pass scan then runs every segment from its
// S_g in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

struct SegmentCarryParams {
  int num_seqs = 0, heads = 0, dk = 0, dv = 0;
  // [num_seqs + 1] index of each sequence's first segment (a sequence may
  // have none: its state passes through).
  const int32_t* seq_segments = nullptr;
  // [segments + 1] packed token offsets of the segments.
  const int32_t* segment_cu = nullptr;
  int segments = 0;
  // The scan's decays (ScanParams::left, left_vector, right); no shift.
  LogGate left;
  bool left_vector = false;
  LogGate right;
  const float* local_final = nullptr;  // [segments, H, dk, dv]: F_g
  float* entering = nullptr;           // [segments, H, dk, dv]: S_g (written)
  // Per sequence, as the scan's: s_init.ptr null is a zero state; s_final may
  // be s_init (in place); s_final.ptr null leaves the final state unwritten.
  StateRef s_init, s_final;
  // Scratch of SegmentDecaySumsFloats for the segments' summed log decays.
  float* decay_sums = nullptr;
};

// Floats of SegmentCarryParams::decay_sums (enough for gates on both sides).
inline int64_t SegmentDecaySumsFloats(int segments, int heads, int dk, int dv) {
  return static_cast<int64_t>(segments) * heads * (dk + dv);
}

// Writes segment_cu [segments + 1] and seq_segments [num_seqs + 1] for spans
// of `span` tokens (a multiple of the scan's chunk) of every sequence of
// cu_seqlens; segments = Σ ⌈len / span⌉. On the device, so that no upload
// waits for the stream.
cudaError_t LaunchSegmentOffsets(const int32_t* cu_seqlens, int num_seqs, int span,
                                 int32_t* segment_cu, int32_t* seq_segments, cudaStream_t stream);

cudaError_t LaunchCarrySegmentStates(const SegmentCarryParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
