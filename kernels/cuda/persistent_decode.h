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
// A barrier costs microseconds, so a layer has two. A row product (each
// CTA some whole output rows) needs its whole input; a column product (each
// CTA some input columns, adding its partial outputs into fp32 sums in
// global memory) needs only the columns the CTA itself made. So the state
// step feeds o_proj's columns of its own value columns, and the MLP's gate
// and up rows feed down's columns of the same units, with no barrier
// between; and the state step waits for its words of the input product's
// output, each stored with a flag beside it, rather than for every CTA: the
// layer is  [in rows, state step, o_proj columns] | [gate/up rows, down
// columns] | . Per-head RMS scales, known only once every CTA has stepped,
// scale o_proj's per-head sums when they are read.
//
// Weights stream as 8 KB tiles in the m16n8k16 A-fragment order, so a lane
// reads its fragment with one 16-byte load, and x is the B operand's first
// column: a row tile is 16 rows by 256 columns (PersistentDecodeTileOffset),
// a column tile 256 rows by 16 columns (PersistentDecodeColumnTileOffset).
// The CTA's stream holds, phase after phase, the tiles of its share
// (PhaseShare), unit after unit in a column product, column block after
// column block in a row product.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

namespace lair::kernels::cuda {

// The products of a layer, in stream order, and the head after the layers.
enum class DecodePhase : int {
  kMixerIn,   // rows: q, k, v, g (when gated) and gk_proj.0's, of the normed x
  kMixerOut,  // columns: o_proj, of the gated head norm's output
  kMlpIn,     // rows: gate and up, 8 pairs a group (rows 0-7 gate, 8-15 up), of the normed x
  kMlpOut,    // columns: down, of silu(gate)·up
  kHead,      // rows: lm_head, of the normed x
};

__host__ __device__ inline bool IsColumnPhase(DecodePhase phase) {
  return phase == DecodePhase::kMixerOut || phase == DecodePhase::kMlpOut;
}

constexpr int kDecodeTileRows = 16;
constexpr int kDecodeTileCols = 256;
constexpr int kDecodeTileBytes = kDecodeTileRows * kDecodeTileCols * 2;
constexpr int kDecodeSliceCols = 16;  // a column product's unit: one k-step

struct PersistentDecodeDims {
  int hidden = 0, ffn = 0, vocab = 0, layers = 0;
  int heads = 0, dk = 0, dv = 0, rank = 0;
  bool output_gate = true;
  // Rows of the mixer's input product: q and k (H·dk each), v and g (H·dv
  // each, g when gated), then gk_proj.0 (rank).
  __host__ __device__ int MixerInRows() const {
    return 2 * heads * dk + (output_gate ? 2 : 1) * heads * dv + rank;
  }
  // The units a phase splits over the CTAs: 16-row groups of a row product
  // (kMlpIn's hold 8 gate/up pairs), 16-column slices of a column product.
  __host__ __device__ int Units(DecodePhase phase) const {
    switch (phase) {
      case DecodePhase::kMixerIn:
        return MixerInRows() / kDecodeTileRows;
      case DecodePhase::kMixerOut:
        return heads * dv / kDecodeSliceCols;
      case DecodePhase::kMlpIn:
        return ffn / (kDecodeTileRows / 2);
      case DecodePhase::kMlpOut:
        return ffn / kDecodeSliceCols;
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
  // The tiles of one unit: a row group's column blocks, or a column slice's
  // 256-row blocks.
  __host__ __device__ int TilesPerUnit(DecodePhase phase) const {
    return (IsColumnPhase(phase) ? hidden : Cols(phase)) / kDecodeTileCols;
  }
};

// CTA c's units of a phase of `units`: [GroupBegin(c), GroupBegin(c + 1)).
__host__ __device__ inline int GroupBegin(int units, int ctas, int c) {
  return static_cast<int>(static_cast<int64_t>(units) * c / ctas);
}

// A CTA's units of a phase: [begin, begin + count).
struct DecodeShare {
  int begin = 0, count = 0;
};

// CTA c's share of `phase`. o_proj's slice c is the 16 value columns the
// CTA stepped; gate/up and down split the MLP's 16-column units alike
// (two kMlpIn groups a unit), so down's columns are the ones the CTA's
// gate/up rows made.
__host__ __device__ inline DecodeShare PhaseShare(const PersistentDecodeDims& d, DecodePhase phase,
                                                  int ctas, int c) {
  if (phase == DecodePhase::kMixerOut) {
    const int slices = d.Units(phase);
    return c < slices ? DecodeShare{c, 1} : DecodeShare{slices, 0};
  }
  if (phase == DecodePhase::kMlpIn || phase == DecodePhase::kMlpOut) {
    const int units = d.ffn / kDecodeSliceCols;
    const int u0 = GroupBegin(units, ctas, c), u1 = GroupBegin(units, ctas, c + 1);
    return phase == DecodePhase::kMlpIn ? DecodeShare{2 * u0, 2 * (u1 - u0)}
                                        : DecodeShare{u0, u1 - u0};
  }
  const int units = d.Units(phase);
  const int u0 = GroupBegin(units, ctas, c);
  return DecodeShare{u0, GroupBegin(units, ctas, c + 1) - u0};
}

// The tiles of CTA c's share of `phase`, which its stream holds in phase
// order (kMixerIn, kMixerOut, kMlpIn, kMlpOut a layer, then kHead).
__host__ __device__ inline int64_t PhaseTiles(const PersistentDecodeDims& d, DecodePhase phase,
                                              int ctas, int c) {
  return static_cast<int64_t>(PhaseShare(d, phase, ctas, c).count) * d.TilesPerUnit(phase);
}

// Byte offset, within a row tile, of element (r, k) of its 16 × 256 block:
// the 16 k-steps one after another, each 32 lanes of 16 bytes holding the
// lane's m16n8k16 A fragment {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1),
// (g, 2t+8), (g, 2t+9), (g+8, 2t+8), (g+8, 2t+9)} (g = lane/4, t = lane%4).
__host__ __device__ inline int PersistentDecodeTileOffset(int r, int k) {
  const int step = k / 16, kk = k % 16, lane = (r % 8) * 4 + (kk % 8) / 2;
  const int slot = (kk / 8) * 4 + (r / 8) * 2 + kk % 2;
  return step * 512 + lane * 16 + slot * 2;
}

// Byte offset, within a column tile, of element (r, k) of its 256 × 16
// block: its 16-row fragments one after another, each as a row tile's first
// k-step.
__host__ __device__ inline int PersistentDecodeColumnTileOffset(int r, int k) {
  return (r / kDecodeTileRows) * 512 + PersistentDecodeTileOffset(r % kDecodeTileRows, k);
}

// The head's argmax as one integer max, ArgmaxRows's answer: DecodeArgmaxKey
// orders (logit, index) pairs by the larger logit, then the smaller index
// (the first maximum; -0 ties +0); NaN and -inf get 0, which never wins.
// DecodeArgmaxIndex reads the index back (0 where every key was 0).
__host__ __device__ inline unsigned long long DecodeArgmaxKey(float logit, int index) {
  if (!(logit > -3.402823466e38f || logit == -3.402823466e38f)) return 0;  // NaN, -inf
  if (logit == 0.0f) logit = 0.0f;
  unsigned bits;
  memcpy(&bits, &logit, sizeof(bits));
  bits ^= (bits >> 31) ? 0xffffffffu : 0x80000000u;  // the float order as unsigned
  return (static_cast<unsigned long long>(bits) << 32) |
         (0xffffffffu - static_cast<unsigned>(index));
}
__host__ __device__ inline int32_t DecodeArgmaxIndex(unsigned long long key) {
  return key == 0 ? 0 : static_cast<int32_t>(0xffffffffu - static_cast<unsigned>(key));
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
  int32_t token = 0;                                 // the step's input token
  int slot = 0;
  // Work buffers: the residual stream x [2][hidden] (a layer reads one,
  // sums into the other); y [MixerInRows] as words of (flag << 32 | fp32
  // bits), layer l's flag y_flag_base + l + 1; o_proj's per-head sums
  // mixer_sums [2][H][hidden] and head_sq [2][H] (a set a layer parity,
  // set 0 zero at launch).
  float* x[2] = {nullptr, nullptr};
  unsigned long long* y = nullptr;
  unsigned y_flag_base = 0;
  float *mixer_sums = nullptr, *head_sq = nullptr;
  // The barriers' count of arrivals, never reset: this launch's barrier b
  // waits for arrival_base + b·ctas (mod 2³²), and the launch adds
  // PersistentDecodeArrivals.
  unsigned* arrivals = nullptr;
  unsigned arrival_base = 0;
  float* logits = nullptr;             // [vocab]
  unsigned long long* best = nullptr;  // the head's argmax as it is reduced
  int32_t* ids = nullptr;              // device [1]: the logits' argmax, or null
};

// The arrivals one launch adds: each CTA's at the layers' barriers, and at
// the end (the last CTA to arrive finishes the argmax).
__host__ __device__ inline unsigned PersistentDecodeArrivals(const PersistentDecodeParams& p) {
  return static_cast<unsigned>((2 * p.dims.layers + 1) * p.ctas);
}

// The CTAs the kernel runs on the current device (one per SM).
int PersistentDecodeCtas();
// Sets the kernel's shared memory for p's shapes; once, before launches.
cudaError_t ConfigurePersistentDecode(const PersistentDecodeParams& p);
// Launches the kernel cooperatively.
cudaError_t LaunchPersistentDecode(const PersistentDecodeParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
