// A vector-decay decoder's whole decode step for one sequence as one
// persistent kernel (GLA's layers: a vector decay from a low-rank gate, a
// per-head RMSNorm gated by swish(g), a SwiGLU MLP). One CTA per SM, all
// resident, runs every phase of every layer, and the phases meet at
// grid-wide barriers; one warp of each CTA meanwhile streams the CTA's share
// of every weight, in the order the phases read them, through a ring of
// shared-memory stages (bulk copies completing on mbarriers). The stream
// depends on no activation, so the loads of the next phases fly (as far as
// the ring reaches) while a phase waits at its barrier, where a chain of
// kernels would wait for each kernel boundary.
//
// Products are 16-row tiles of 256 columns in the m16n8k16 A-fragment order
// (PersistentDecodeTile), so a lane reads its fragment with one 16-byte load;
// x is the B operand's first column. Each phase gives CTA c the 16-row groups
// [G·c/P, G·(c+1)/P) of its G, and the CTA's stream holds, phase after
// phase, the tiles of its groups column block by column block.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lair::kernels::cuda {

// The products of a layer, in stream order, and the head after the layers.
enum class DecodePhase : int {
  kMixerIn,   // q, k, v, g (when gated) and gk_proj.0's rows, of the normed x
  kMixerOut,  // o_proj, of the gated head norm's output
  kMlpIn,     // gate and up, 8 pairs a group (rows 0-7 gate, 8-15 up), of the normed x
  kMlpOut,    // down, of silu(gate)·up
  kHead,      // lm_head, of the normed x
};

constexpr int kDecodeTileRows = 16;
constexpr int kDecodeTileCols = 256;
constexpr int kDecodeTileBytes = kDecodeTileRows * kDecodeTileCols * 2;

struct PersistentDecodeDims {
  int hidden = 0, ffn = 0, vocab = 0, layers = 0;
  int heads = 0, dk = 0, dv = 0, rank = 0;
  bool output_gate = true;
  // Rows of the mixer's input product: q and k (H·dk each), v and g (H·dv
  // each, g when gated), then gk_proj.0 (rank).
  __host__ __device__ int MixerInRows() const {
    return 2 * heads * dk + (output_gate ? 2 : 1) * heads * dv + rank;
  }
  __host__ __device__ int Groups(DecodePhase phase) const {
    switch (phase) {
      case DecodePhase::kMixerIn:
        return MixerInRows() / kDecodeTileRows;
      case DecodePhase::kMixerOut:
      case DecodePhase::kMlpOut:
        return hidden / kDecodeTileRows;
      case DecodePhase::kMlpIn:
        return ffn / (kDecodeTileRows / 2);
      case DecodePhase::kHead:
        return vocab / kDecodeTileRows;
    }
    return 0;
  }
  // The product's k: its input's width.
  __host__ __device__ int Cols(DecodePhase phase) const {
    if (phase == DecodePhase::kMixerOut) return heads * dv;
    if (phase == DecodePhase::kMlpOut) return ffn;
    return hidden;
  }
};

// CTA c's groups of a phase of `groups`: [GroupBegin(c), GroupBegin(c + 1)).
__host__ __device__ inline int GroupBegin(int groups, int ctas, int c) {
  return static_cast<int>(static_cast<int64_t>(groups) * c / ctas);
}

// Byte offset, within a tile, of element (r, k) of its 16 × 256 block: the
// 16 k-steps one after another, each 32 lanes of 16 bytes holding the lane's
// m16n8k16 A fragment {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), (g, 2t+8),
// (g, 2t+9), (g+8, 2t+8), (g+8, 2t+9)} (g = lane/4, t = lane%4).
__host__ __device__ inline int PersistentDecodeTileOffset(int r, int k) {
  const int step = k / 16, kk = k % 16, lane = (r % 8) * 4 + (kk % 8) / 2;
  const int slot = (kk / 8) * 4 + (r / 8) * 2 + kk % 2;
  return step * 512 + lane * 16 + slot * 2;
}

// What Supports checks: the tile and work shapes this kernel takes.
bool PersistentDecodeSupports(const PersistentDecodeDims& d, int ctas);

// One layer's small operands (fp32, device).
struct PersistentDecodeLayerRefs {
  float* state = nullptr;             // the pool's recurrent state [slots][H][dk][dv]
  const float* gate = nullptr;        // gk_proj.1 as [H·dk][rank], then its bias [H·dk]
  const float* mixer_norm = nullptr;  // [hidden], or null: folded into the product's columns
  const float* head_norm = nullptr;   // [dv], or null: no affine weight
  const float* mlp_norm = nullptr;    // [hidden], or null: folded
};

struct PersistentDecodeParams {
  PersistentDecodeDims dims;
  int ctas = 0;  // the grid: at most one CTA per SM, all resident
  float block_eps = 1e-6f, head_eps = 1e-6f;
  float gate_scale = 1.0f;  // gk = gate_scale · log σ(·)
  float q_scale = 1.0f;
  const uint8_t* stream = nullptr;                   // every CTA's tiles
  const int64_t* stream_offsets = nullptr;           // [ctas + 1] byte offsets of each CTA's
  const PersistentDecodeLayerRefs* layer = nullptr;  // [layers], device
  int64_t state_slot_stride = 0;                     // floats per slot of a state
  const float* embedding = nullptr;                  // [vocab][hidden]
  const float* final_norm = nullptr;                 // [hidden], or null: folded
  const int32_t* token = nullptr;                    // device [1]
  int slot = 0;
  // fp32 work buffers: x [hidden], y [MixerInRows], o [H·dv], head_sq
  // [layers][H], h [ffn]; the barrier's arrivals (zeroed by the launch).
  float *x = nullptr, *y = nullptr, *o = nullptr, *head_sq = nullptr, *h = nullptr;
  unsigned* arrivals = nullptr;
  float* logits = nullptr;  // [vocab]
};

// The CTAs the kernel runs on the current device (one per SM).
int PersistentDecodeCtas();
// Zeroes p.arrivals and launches the kernel cooperatively.
cudaError_t LaunchPersistentDecode(const PersistentDecodeParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
