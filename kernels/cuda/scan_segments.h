// The segmented forward scan's own kernels (cuda_backend.cc, ScanSchedule
// kSegmented). A long prompt's scan walks its chunks in order, one CTA per
// (sequence, head, tile): a prefill of one sequence leaves most
// multiprocessors idle. Cut into segments of whole chunks, every segment is
// first scanned from a zero state, giving its local final state F_g. The
// scans this schedule serves have outputs linear in the state (no mLSTM
// normalizer or stabilizer), so with
//   L_t = e^{Σ_{u ∈ g, u ≤ t} left_u},  R_t = e^{Σ_{u ∈ g, u ≤ t} right_u},
//   D_g[a, e] = e^{Σ_{u ∈ g} left_u[a] + right_u[e]},
// the state entering segment g and every output are
//   S_0 = s_init,  S_{g+1} = D_g ⊙ S_g + F_g              (the carry)
//   o_t = o^loc_t + ((q'_t ⊙ L_t)ᵀ S_g) ⊙ R_t,  t ∈ g      (the entry term),
// o^loc the segment's outputs from a zero state. The carry is all that stays
// sequential: elementwise over the state, one step per segment.
//
// Two schedules use it (cuda_backend.cc, RunSegmented). Where the state is
// wide, the one-pass scan runs each segment from zero, writing o^loc and F_g
// at once, and the entry term is a [tokens × dk]·[dk × dv] product per
// (segment, head) on the tensor cores, against a bf16 copy of S_g (the one
// rounding of it, as the two-pass scan rounds the state entering a chunk).
// Otherwise a state pass gives F_g and, after the carry, the one-pass scan
// runs each segment again from its S_g.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// Tokens per decay-sum chunk: the entry term takes a chunk per CTA.
constexpr int kSegmentChunk = 64;

struct SegmentParams {
  int num_seqs = 0, heads = 0, dk = 0, dv = 0;
  // [num_seqs + 1] index of each sequence's first segment (a sequence may
  // have none: its state passes through).
  const int32_t* seq_segments = nullptr;
  // [segments + 1] packed token offsets of the segments, each `span` tokens
  // (a multiple of kSegmentChunk) but a sequence's last.
  const int32_t* segment_cu = nullptr;
  int segments = 0, span = 0;
  // The scan's decays (ScanParams::left, left_vector, right); no shift.
  LogGate left;
  bool left_vector = false;
  LogGate right;
  // Scratch of SegmentDecaySumsFloats: every chunk's summed log decays, then
  // every segment's.
  float* decay_sums = nullptr;

  // The carry.
  const float* local_final = nullptr;  // [segments, H, dk, dv]: F_g
  void* entering = nullptr;            // [segments, H, dk, dv]: S_g (written)
  // bf16 for the entry term; fp32 where the one-pass scan starts each
  // segment from S_g instead (cuda_backend.cc, RunSegmented).
  ElemType entering_type = ElemType::kBF16;
  // Per sequence, as the scan's: s_init.ptr null is a zero state; s_final may
  // be s_init (in place); s_final.ptr null leaves the final state unwritten.
  StateRef s_init, s_final;

  // The entry term: o = Σ_c local_out[·, c] + the term. local_out is 16-bit
  // where o is (the outputs are rounded there anyway), halving the bytes the
  // parts cost.
  Operand q;  // bf16 or f16, [N, H, dk]
  float q_scale = 1.0f;
  const void* local_out = nullptr;  // [N, H, copies, dv]: o^loc in key-block parts
  ElemType local_type = ElemType::kF32;
  int copies = 1;
  void* o = nullptr;  // [N, H, dv]
  ElemType o_type = ElemType::kF32;
};

// Floats of SegmentParams::decay_sums (enough for gates on both sides).
inline int64_t SegmentDecaySumsFloats(int segments, int span, int heads, int dk, int dv) {
  return static_cast<int64_t>(segments) * (span / kSegmentChunk + 1) * heads * (dk + dv);
}

// Writes segment_cu [segments + 1] and seq_segments [num_seqs + 1] for spans
// of `span` tokens (a multiple of the scan's chunk) of every sequence of
// cu_seqlens; segments = Σ ⌈len / span⌉. On the device, so that no upload
// waits for the stream.
cudaError_t LaunchSegmentOffsets(const int32_t* cu_seqlens, int num_seqs, int span,
                                 int32_t* segment_cu, int32_t* seq_segments, cudaStream_t stream);

// The chunks' and segments' decay sums, then the carry: writes entering and
// s_final.
cudaError_t LaunchCarrySegmentStates(const SegmentParams& p, cudaStream_t stream);

// Whether LaunchAddSegmentEntries takes p: dk and dv multiples of 16, q
// 16-bit and 16-byte aligned, a right decay alone, entering in bf16.
bool SegmentEntriesSupported(const SegmentParams& p);
// After the carry: writes o from local_out and the entry term.
cudaError_t LaunchAddSegmentEntries(const SegmentParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
