// The persistent decode kernel (persistent_decode.h). A CTA is eight
// consumer warps and one producer warp:
//   producer: for each stage-sized chunk j of the CTA's weight stream, wait
//     until ring stage j % S is free, then bulk-copy the chunk into it
//     (completing on the stage's `full` mbarrier); from a layer's first
//     whole MLP chunk on, only once the consumers have their words of y
//     (Smem::mlp_released);
//   consumers: for each product, form its input in shared memory (bf16),
//     take the CTA's tiles (warp w those with stream index ≡ w mod 8), sum
//     each tile's m16n8k16 products into the CTA's rows, free the tile's
//     stage (`empty`, four tiles a stage), then finish the rows.
// A layer, with x the residual stream (fp32, in global memory, a layer
// reading x[l % 2] and summing x' = x[(l + 1) % 2]) and | a grid barrier:
//   1. y = W_in · rms(x)   (q, k, v, g, z = gk_proj.0's output), published
//      as words flagged with the layer; zero x' and the next layer's sums;
//   2. the state step, 16 value columns of one head a CTA, its key a thread,
//      once its words of y carry the layer's flag:
//        gk = scale · log σ(W_gk z + b),  S ← diag(e^{gk}) S + k vᵀ,
//        o = S ᵀ(q_scale · q),  head_sq[h] += Σ o²;
//      then m[h] += W_o[:, its columns] · (o · w_head · swish(g))          |
//   3. x'' = x + Σ_h rms_h · m[h]  (every CTA; CTA c adds its share to x'),
//      u = silu(W_gate · rms(x'')) · (W_up · rms(x'')) for the CTA's units,
//      x' += W_down[:, those units] · u                                    |
// then logits = W_head · rms(x), each CTA folding its rows' argmax into one
// 64-bit key with atomicMax; the last CTA to finish writes the winner's
// index. Cross-CTA data is read through L2 (ld.cg).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma_fragments.cuh"
#include "kernels/cuda/persistent_decode.h"
#include "kernels/elementwise_math.h"

namespace lair::kernels::cuda {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
// Warp w takes the stream's tiles ≡ w mod 8, so it waits on every other
// stage, in order. With an even number of stages, the phase before the one
// it waits on is a stage it waited on itself, and a slot is refilled only
// after its warps free it: no warp can wait on a slot two phases apart (an
// mbarrier's parity names only two).
constexpr int kTilesPerStage = 4;
constexpr int kStageBytes = kTilesPerStage * kDecodeTileBytes;
constexpr int kStages = 6;
static_assert(kStages % (kConsumerWarps / kTilesPerStage) == 0);
// Value columns of a CTA's share of the state step: o_proj's slice of them.
constexpr int kStepColumns = kDecodeSliceCols;
constexpr int kMaxRank = 16;  // gk_proj's low rank (fla's default)
// x and o_proj's sums are read as float4s, all issued before any use (one
// round trip to L2): at most kQuads a thread.
constexpr int kQuads = 2;
constexpr int kMaxHidden = 4 * kQuads * kConsumers;

// Shared memory beyond the ring.
struct Smem {
  uint64_t full[kStages], empty[kStages];
  // The layers whose MLP the producer may stream: the consumers count one
  // when their words of y are in. Every L2 round trip takes two to three
  // times as long while the stream fills DRAM's queues, and the MLP's
  // chunks are not read before the barrier after o_proj; held back until
  // then, they no longer slow the y exchange on the critical path (on an
  // H200, GLA 1.3B: the words in 0.7 µs after the last is published instead
  // of 3.6, a layer 35.4 µs instead of 36.9; docs/benchmarks.md). A count,
  // not an mbarrier: the consumers may run layers ahead of the producer's
  // waits, and a parity tells only two phases apart.
  volatile int mlp_released;
  float warp_sums[kConsumerWarps][kStepColumns];
  float z[kMaxRank];                             // the state step's low-rank gate input
  unsigned long long warp_best[kConsumerWarps];  // the head's argmax keys
};

// The device code exists for sm_90 alone (bulk copies and mbarriers); other
// architectures compile an empty kernel that no launch reaches.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr unsigned kAll = 0xffffffffu;

// --- mbarriers and bulk copies (sm_90) ---------------------------------------

__device__ __forceinline__ void MbarInit(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count));
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}
__device__ __forceinline__ void MbarExpectBytes(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst, counted on bar.
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, unsigned bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// The consumers' own barrier (named barrier 1; the producer never joins).
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
}

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

class Consumer {
 public:
  __device__ Consumer(const PersistentDecodeParams& p, unsigned char* ring, Smem* s,
                      __nv_bfloat16* input, float* rows)
      : p_(p), d_(p.dims), ring_(ring), s_(s), input_(input), rows_(rows) {}

  __device__ void Run() {
    const float* x = p_.embedding + static_cast<int64_t>(p_.token) * d_.hidden;
    if (blockIdx.x == 0 && tid_ == 0) *p_.best = 0;  // read after the layers' barriers
    for (int l = 0; l < d_.layers; ++l) {
      const PersistentDecodeLayerRefs layer = p_.layer[l];
      const int set = l % 2;
      const unsigned flag = p_.y_flag_base + l + 1;
      float* const next = p_.x[(l + 1) % 2];
      float state[kStepColumns];
      const bool stepping = LoadState(layer, state);
      if (!stepping) ReleaseMlpStream();
      ZeroSums(next, 1 - set);
      NormedInput(x, layer.mixer_norm);
      Product(DecodePhase::kMixerIn);
      PublishY(flag);
      if (stepping) Step(layer, state, flag, set);
      Product(DecodePhase::kMixerOut);
      if (stepping) AddRows(MixerSums(set) + static_cast<int64_t>(StepHead()) * d_.hidden);
      GridSync();
      MlpNormedInput(x, layer.mlp_norm, next, set);
      Product(DecodePhase::kMlpIn);
      SwiGluInput();
      Product(DecodePhase::kMlpOut);
      AddRows(next);
      GridSync();
      x = next;
    }
    ZeroSums(nullptr, 0);  // the next launch's first layer
    NormedInput(x, p_.final_norm);
    Product(DecodePhase::kHead);
    const float scale = InputScale();
    unsigned long long best = 0;
    for (int r = tid_; r < rows_here_; r += kConsumers) {
      const float logit = scale * rows_[r];
      p_.logits[row0_ + r] = logit;
      best = max(best, DecodeArgmaxKey(logit, row0_ + r));
    }
    FinishArgmax(best);
  }

 private:
  // Reduces the CTA's argmax keys into p.best, then arrives; the last CTA
  // to arrive writes the winner's index to p.ids (DecodeArgmaxIndex).
  __device__ void FinishArgmax(unsigned long long best) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) best = max(best, __shfl_xor_sync(kAll, best, off));
    if (lane_ == 0) s_->warp_best[warp_] = best;
    ConsumerSync();
    if (tid_ != 0) return;
    for (int wi = 0; wi < kConsumerWarps; ++wi) best = max(best, s_->warp_best[wi]);
    if (best != 0) atomicMax(p_.best, best);
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n"
                 : "=r"(before)
                 : "l"(p_.arrivals)
                 : "memory");
    const unsigned last = p_.arrival_base + PersistentDecodeArrivals(p_) - 1;
    if (before == last && p_.ids) {
      const unsigned long long winner = __ldcg(p_.best);
      p_.ids[0] = DecodeArgmaxIndex(winner);
    }
  }

  // o_proj's per-head sums and the heads' sums of squares, in two sets: a
  // layer adds into set l % 2, which the layer before zeroed (the barriers
  // between order the zeroing before any sum, with none between a layer's
  // input product and its state step).
  __device__ float* MixerSums(int set) const {
    return p_.mixer_sums + static_cast<int64_t>(set) * d_.heads * d_.hidden;
  }
  __device__ float* HeadSq(int set) const { return p_.head_sq + set * d_.heads; }

  // Zeroes this CTA's share of `next` x (unless null) and of sum set `set`.
  // Their last readers were a layer before, ahead of its last barrier.
  __device__ void ZeroSums(float* next, int set) {
    if (next) ZeroShare(next, d_.hidden);
    ZeroShare(MixerSums(set), d_.heads * d_.hidden);
    if (blockIdx.x == 0 && tid_ < d_.heads) HeadSq(set)[tid_] = 0.0f;
  }

  // Stores the input product's rows as y words: the value's bits beside
  // this layer's flag, in one 64-bit store, so that a reader that sees the
  // flag sees the value (WaitY) and no barrier is needed.
  __device__ void PublishY(unsigned flag) {
    const float scale = InputScale();
    const unsigned long long tag = static_cast<unsigned long long>(flag) << 32;
    for (int r = tid_; r < rows_here_; r += kConsumers) {
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(p_.y + row0_ + r),
                   "l"(tag | __float_as_uint(scale * rows_[r]))
                   : "memory");
    }
    ConsumerSync();  // rows_ read before the next product zeroes them
  }

  // out[i] = y[at[i]] (at[i] < 0: 0) once its word carries `flag`.
  template <int kN>
  __device__ void WaitY(const int (&at)[kN], float (&out)[kN], unsigned flag) const {
    unsigned long long word[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) word[i] = static_cast<unsigned long long>(flag) << 32;
    for (bool first = true;; first = false) {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        if (at[i] >= 0 && (first || word[i] >> 32 != flag)) {
          asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n"
                       : "=l"(word[i])
                       : "l"(p_.y + at[i])
                       : "memory");
        }
      }
      bool ready = true;
#pragma unroll
      for (int i = 0; i < kN; ++i) ready &= word[i] >> 32 == flag;
      if (ready) break;
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = __uint_as_float(static_cast<unsigned>(word[i]));
  }

  __device__ void ZeroShare(float* dst, int n) {
    const int quads = n / 4, c = blockIdx.x;
    const int end = GroupBegin(quads, p_.ctas, c + 1);
    for (int q = GroupBegin(quads, p_.ctas, c) + tid_; q < end; q += kConsumers)
      reinterpret_cast<float4*>(dst)[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  // The state rows this thread updates (key tid of 16 columns of one head),
  // read before the mixer's product so their loads fly under it.
  __device__ bool LoadState(const PersistentDecodeLayerRefs& layer, float (&state)[kStepColumns]) {
    const int unit = blockIdx.x, units = d_.heads * d_.dv / kStepColumns;
    if (unit >= units) return false;
    const float4* src = reinterpret_cast<const float4*>(StateRow(layer, unit));
#pragma unroll
    for (int q = 0; q < kStepColumns / 4; ++q) {
      const float4 v = __ldcs(src + q);
      state[4 * q] = v.x, state[4 * q + 1] = v.y, state[4 * q + 2] = v.z, state[4 * q + 3] = v.w;
    }
    return true;
  }
  __device__ float* StateRow(const PersistentDecodeLayerRefs& layer, int unit) const {
    const int per_head = d_.dv / kStepColumns, h = unit / per_head;
    const int col0 = (unit % per_head) * kStepColumns;
    return layer.state + p_.slot * p_.state_slot_stride +
           (static_cast<int64_t>(h) * d_.dk + tid_) * d_.dv + col0;
  }
  // The head of this CTA's state step.
  __device__ int StepHead() const { return blockIdx.x / (d_.dv / kStepColumns); }

  // Steps the CTA's 16 value columns and leaves o_proj's input for them,
  // o · w_head · swish(g) (bf16), at input_[0, 16); its head's rms scales
  // the product's sums when they are read (MlpNormedInput).
  __device__ void Step(const PersistentDecodeLayerRefs& layer, float (&state)[kStepColumns],
                       unsigned flag, int set) {
    const int unit = blockIdx.x, per_head = d_.dv / kStepColumns, h = StepHead();
    const int col0 = (unit % per_head) * kStepColumns, key = h * d_.dk + tid_;
    const int hk = d_.heads * d_.dk, hv = d_.heads * d_.dv;
    // Every load first (L2 round trips overlap): q, k, this CTA's v and one
    // extra word (warp 0: the output gate of its columns; warp 1: the gate
    // input z, to shared memory), the key's gate row and bias and the head
    // norm weight of the columns.
    constexpr int kWords = 2 + kStepColumns + 1;
    int at[kWords];
    at[0] = key, at[1] = hk + key;
#pragma unroll
    for (int j = 0; j < kStepColumns; ++j) at[2 + j] = 2 * hk + h * d_.dv + col0 + j;
    const int z0 = 2 * hk + (d_.output_gate ? 2 : 1) * hv;
    at[kWords - 1] = warp_ == 0 && lane_ < kStepColumns && d_.output_gate
                         ? 2 * hk + hv + h * d_.dv + col0 + lane_
                     : warp_ == 1 && lane_ < d_.rank ? z0 + lane_
                                                     : -1;
    float out_weight = 1.0f;
    if (tid_ < kStepColumns && layer.head_norm) out_weight = layer.head_norm[col0 + tid_];
    const float4* w =
        reinterpret_cast<const float4*>(layer.gate + static_cast<int64_t>(key) * d_.rank);
    float4 wr[kMaxRank / 4];
#pragma unroll
    for (int r = 0; r < kMaxRank / 4; ++r)
      if (4 * r < d_.rank) wr[r] = w[r];
    float logit = layer.gate[static_cast<int64_t>(hk) * d_.rank + key];
    float words[kWords];
    WaitY(at, words, flag);
    const float q = p_.q_scale * words[0], k = words[1];
    float v[kStepColumns];
#pragma unroll
    for (int j = 0; j < kStepColumns; ++j) v[j] = words[2 + j];
    const float out_gate = warp_ == 0 && d_.output_gate ? Silu(words[kWords - 1]) : 1.0f;
    if (warp_ == 1 && lane_ < d_.rank) s_->z[lane_] = words[kWords - 1];
    ConsumerSync();  // z in shared memory, and every warp's words of y in
    ReleaseMlpStream();
#pragma unroll
    for (int r = 0; r < kMaxRank / 4; ++r)
      if (4 * r < d_.rank)
        logit += s_->z[4 * r] * wr[r].x + s_->z[4 * r + 1] * wr[r].y + s_->z[4 * r + 2] * wr[r].z +
                 s_->z[4 * r + 3] * wr[r].w;
    // The key's log decay from the low-rank input.
    const float decay = __expf(p_.gate_scale * LogSigmoid(logit));
    float part[kStepColumns];
#pragma unroll
    for (int j = 0; j < kStepColumns; ++j) {
      state[j] = decay * state[j] + k * v[j];
      part[j] = state[j] * q;
    }
    float4* dst = reinterpret_cast<float4*>(StateRow(layer, unit));
#pragma unroll
    for (int c = 0; c < kStepColumns / 4; ++c) {
      __stcs(dst + c,
             make_float4(state[4 * c], state[4 * c + 1], state[4 * c + 2], state[4 * c + 3]));
    }
    // o = Σ over the keys (the CTA's threads): warps, then their sums.
#pragma unroll
    for (int j = 0; j < kStepColumns; ++j) {
      float s = part[j];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(kAll, s, off);
      if (lane_ == 0) s_->warp_sums[warp_][j] = s;
    }
    ConsumerSync();
    if (warp_ == 0) {
      float o = 0.0f;
      if (lane_ < kStepColumns) {
        for (int wi = 0; wi < kConsumerWarps; ++wi) o += s_->warp_sums[wi][lane_];
        input_[lane_] = __float2bfloat16(o * out_weight * out_gate);
      }
      float sq = o * o;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) sq += __shfl_xor_sync(kAll, sq, off);
      if (lane_ == 0) atomicAdd(HeadSq(set) + h, sq);
    }
  }

  // input = x · weight (weight null: folded into the product), one read of
  // x; its 1/rms, the same for every row, scales the product's rows after
  // (InputScale).
  __device__ void NormedInput(const float* x, const float* weight) {
    float4 xv[kQuads];
    LoadQuads(x, d_.hidden, xv);
    StoreNormed(xv, weight);
  }

  // The MLP's input: x'' = x + Σ_h rms_h · m[h] (the mixer's output added to
  // the residual), normed as NormedInput; CTA c's share of x'' starts the
  // next x, which down's partial sums complete.
  __device__ void MlpNormedInput(const float* x, const float* weight, float* next, int set) {
    float4 xv[kQuads];
    LoadQuads(x, d_.hidden, xv);
#pragma unroll 4
    for (int h = 0; h < d_.heads; ++h) {
      float4 mv[kQuads];
      LoadQuads(MixerSums(set) + static_cast<int64_t>(h) * d_.hidden, d_.hidden, mv);
      const float scale = rsqrtf(__ldcg(HeadSq(set) + h) / d_.dv + p_.head_eps);
#pragma unroll
      for (int i = 0; i < kQuads; ++i) {
        xv[i].x += scale * mv[i].x, xv[i].y += scale * mv[i].y;
        xv[i].z += scale * mv[i].z, xv[i].w += scale * mv[i].w;
      }
    }
    const int quads = d_.hidden / 4, c = blockIdx.x;
    const int begin = GroupBegin(quads, p_.ctas, c), end = GroupBegin(quads, p_.ctas, c + 1);
#pragma unroll
    for (int i = 0; i < kQuads; ++i) {
      const int q = tid_ + i * kConsumers;
      if (q >= begin && q < end) atomicAdd(reinterpret_cast<float4*>(next) + q, xv[i]);
    }
    StoreNormed(xv, weight);
  }

  // Stores x · weight as the input and leaves the warps' sums of x² in
  // warp_sums for InputScale.
  __device__ void StoreNormed(const float4 (&xv)[kQuads], const float* weight) {
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kQuads; ++i) {
      const int q = tid_ + i * kConsumers;
      if (4 * q < d_.hidden) {
        float v[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
        sq += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
        if (weight) {
          const float4 w = *reinterpret_cast<const float4*>(weight + 4 * q);
          v[0] *= w.x, v[1] *= w.y, v[2] *= w.z, v[3] *= w.w;
        }
        StoreInput(q, v);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sq += __shfl_xor_sync(kAll, sq, off);
    if (lane_ == 0) s_->warp_sums[warp_][0] = sq;
  }

  // down's input: silu(gate) · up of the CTA's gate/up rows, in order.
  __device__ void SwiGluInput() {
    const float scale = InputScale();
    for (int i = tid_; i < rows_here_ / 2; i += kConsumers) {
      const int group = i / 8, pair = i % 8;
      input_[i] = __float2bfloat16(Silu(scale * rows_[16 * group + pair]) *
                                   (scale * rows_[16 * group + 8 + pair]));
    }
    ConsumerSync();  // rows_ read before the next product zeroes them
  }

  // This thread's float4s of src [n] (float4 i at tid + i·kConsumers; zero
  // past n), every load issued before any use: one round trip to L2.
  template <int kN>
  __device__ void LoadQuads(const float* src, int n, float4 (&out)[kN]) const {
    const float4* quads = reinterpret_cast<const float4*>(src);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int q = tid_ + i * kConsumers;
      out[i] = 4 * q < n ? __ldcg(quads + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  // Input elements 4q..4q+3, rounded to bf16.
  __device__ void StoreInput(int q, const float (&v)[4]) {
    uint2 packed;
    packed.x = PackBf16(v[0], v[1]), packed.y = PackBf16(v[2], v[3]);
    *reinterpret_cast<uint2*>(input_ + 4 * q) = packed;
  }

  // rsqrt(mean(x²) + eps) of the last normed input (after the product's sync).
  __device__ float InputScale() const {
    float total = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kConsumerWarps; ++wi) total += s_->warp_sums[wi][0];
    return rsqrtf(total / d_.hidden + p_.block_eps);
  }

  // rows_ = this CTA's share of `phase` times the input (which the
  // consumers have just formed): a row product's rows [row0_, row0_ +
  // rows_here_), or a column product's partial sums of every row.
  __device__ void Product(DecodePhase phase) {
    const bool columns = IsColumnPhase(phase);
    const DecodeShare share = PhaseShare(d_, phase, p_.ctas, blockIdx.x);
    row0_ = columns ? 0 : kDecodeTileRows * share.begin;
    rows_here_ = columns ? d_.hidden : kDecodeTileRows * share.count;
    for (int r = tid_; r < rows_here_; r += kConsumers) rows_[r] = 0.0f;
    ConsumerSync();  // the input formed, the rows zeroed
    const int per_unit = d_.TilesPerUnit(phase), tiles = share.count * per_unit;
    if (!columns) {
      ForMyTiles(tiles, [&](int t, const unsigned char* tile) {
        SumRowTile(tile, t / share.count, t % share.count);
      });
    } else if (share.count == 1 || per_unit % kConsumerWarps == 0) {
      // Row block b gets the tiles (slice, b): one warp's alone.
      ForMyTiles(tiles, [&](int t, const unsigned char* tile) {
        SumColumnTile<true>(tile, t / per_unit, t % per_unit);
      });
    } else {
      ForMyTiles(tiles, [&](int t, const unsigned char* tile) {
        SumColumnTile<false>(tile, t / per_unit, t % per_unit);
      });
    }
    tile_ += tiles;
    ConsumerSync();  // every tile summed into rows_
  }

  // take(t, tile) for each tile t of the current product's `tiles` that
  // this warp takes (stream index ≡ warp mod 8), in order.
  template <typename Take>
  __device__ void ForMyTiles(int tiles, Take take) {
    for (int t = (warp_ - tile_ % kConsumerWarps + kConsumerWarps) % kConsumerWarps; t < tiles;
         t += kConsumerWarps)
      take(t, TakeTile(tile_ + t));
  }

  // The stream's tile `index`, once the producer has landed it.
  __device__ const unsigned char* TakeTile(int64_t index) {
    const int64_t stage = index / kTilesPerStage;
    const int slot = static_cast<int>(stage % kStages);
    MbarWait(&s_->full[slot], static_cast<unsigned>(stage / kStages) & 1u);
    return ring_ + slot * kStageBytes + (index % kTilesPerStage) * kDecodeTileBytes;
  }
  // Lets the producer stream this layer's MLP (Smem::mlp_released).
  __device__ void ReleaseMlpStream() {
    if (tid_ == 0) s_->mlp_released = ++released_layers_;
  }

  // Frees the tile's share of its stage (every lane's reads of it done).
  __device__ void ReleaseTile(const unsigned char* tile) {
    __syncwarp();
    if (lane_ == 0) MbarArrive(&s_->empty[(tile - ring_) / kStageBytes]);
  }

  // Rows 16·group + [0, 16) += the row tile of column block `block` times
  // the input's block.
  __device__ void SumRowTile(const unsigned char* tile, int block, int group) {
    const int g = lane_ / 4, t4 = lane_ % 4;
    const uint32_t* input = reinterpret_cast<const uint32_t*>(input_);
    // Two accumulators halve the chain of dependent products.
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll 8
    for (int step = 0; step < kDecodeTileCols / 16; ++step) {
      const uint4 raw = *reinterpret_cast<const uint4*>(tile + step * 512 + lane_ * 16);
      const uint32_t a[4] = {raw.x, raw.y, raw.z, raw.w};
      // x is the B operand's column 0 (the lanes of g = 0); the rest are 0.
      uint32_t b0 = 0, b1 = 0;
      if (g == 0) {
        const int k = block * kDecodeTileCols + step * 16 + 2 * t4;
        b0 = input[k / 2], b1 = input[k / 2 + 4];
      }
      Mma(acc[step % 2], a, b0, b1);
    }
    ReleaseTile(tile);
    if (t4 == 0) {
      atomicAdd(rows_ + kDecodeTileRows * group + g, acc[0][0] + acc[1][0]);
      atomicAdd(rows_ + kDecodeTileRows * group + g + 8, acc[0][2] + acc[1][2]);
    }
  }

  // Rows 256·block + [0, 256) += the column tile of slice `slice` (the
  // CTA's slice-th 16 input columns) times those columns; kExclusive: no
  // other warp adds to these rows (else shared atomics, a CAS loop each,
  // which also keep the loads from running ahead).
  template <bool kExclusive>
  __device__ void SumColumnTile(const unsigned char* tile, int slice, int block) {
    const int g = lane_ / 4, t4 = lane_ % 4;
    const uint32_t* input = reinterpret_cast<const uint32_t*>(input_);
    uint32_t b0 = 0, b1 = 0;
    if (g == 0) {
      const int k = slice * kDecodeSliceCols + 2 * t4;
      b0 = input[k / 2], b1 = input[k / 2 + 4];
    }
    float* rows = rows_ + block * kDecodeTileCols;
#pragma unroll 8
    for (int f = 0; f < kDecodeTileCols / kDecodeTileRows; ++f) {
      const uint4 raw = *reinterpret_cast<const uint4*>(tile + f * 512 + lane_ * 16);
      const uint32_t a[4] = {raw.x, raw.y, raw.z, raw.w};
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      Mma(acc, a, b0, b1);
      if (t4 == 0 && kExclusive) {
        rows[kDecodeTileRows * f + g] += acc[0];
        rows[kDecodeTileRows * f + g + 8] += acc[2];
      } else if (t4 == 0) {
        atomicAdd(rows + kDecodeTileRows * f + g, acc[0]);
        atomicAdd(rows + kDecodeTileRows * f + g + 8, acc[2]);
      }
    }
    ReleaseTile(tile);
  }

  // dst [hidden] += rows_, one vector atomic a float4 (sm_90).
  __device__ void AddRows(float* dst) {
    const float4* rows = reinterpret_cast<const float4*>(rows_);
    for (int q = tid_; q < d_.hidden / 4; q += kConsumers)
      atomicAdd(reinterpret_cast<float4*>(dst) + q, rows[q]);
  }

  // Every CTA's consumers past their writes before any reads on.
  __device__ void GridSync() {
    ConsumerSync();
    if (tid_ == 0) {
      ++barriers_;
      // Release: the CTA's writes, ordered before this by the sync above.
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p_.arrivals) : "memory");
      const unsigned target = p_.arrival_base + barriers_ * static_cast<unsigned>(p_.ctas);
      while (static_cast<int>(LoadAcquire(p_.arrivals) - target) < 0) {
      }
    }
    ConsumerSync();
  }

  const PersistentDecodeParams& p_;
  const PersistentDecodeDims& d_;
  unsigned char* ring_;
  Smem* s_;
  __nv_bfloat16* input_;  // the product's input, bf16 [its k]
  float* rows_;           // this CTA's rows of the current product
  const int tid_ = static_cast<int>(threadIdx.x), warp_ = tid_ / 32, lane_ = tid_ % 32;
  int64_t tile_ = 0;  // this CTA's tiles taken so far: the stream's position
  int row0_ = 0, rows_here_ = 0;
  unsigned barriers_ = 0;    // grid barriers passed (thread 0's count)
  int released_layers_ = 0;  // layers whose MLP the producer may stream (thread 0's count)
};

__device__ void Produce(const PersistentDecodeParams& p, unsigned char* ring, Smem* s) {
  const uint8_t* stream = p.stream + p.stream_offsets[blockIdx.x];
  const int64_t bytes = p.stream_offsets[blockIdx.x + 1] - p.stream_offsets[blockIdx.x];
  const int64_t chunks = (bytes + kStageBytes - 1) / kStageBytes;
  // Layer l's MLP starts at tile l·layer_tiles + before_mlp of the stream.
  // From the first chunk that begins there or after, chunks wait until l is
  // released: every tile read before the release lies in an earlier chunk.
  const PersistentDecodeDims& d = p.dims;
  const auto tiles = [&](DecodePhase phase) { return PhaseTiles(d, phase, p.ctas, blockIdx.x); };
  const int64_t before_mlp = tiles(DecodePhase::kMixerIn) + tiles(DecodePhase::kMixerOut);
  const int64_t layer_tiles = before_mlp + tiles(DecodePhase::kMlpIn) + tiles(DecodePhase::kMlpOut);
  const auto first_held_chunk = [&](int l) {
    return (l * layer_tiles + before_mlp + kTilesPerStage - 1) / kTilesPerStage;
  };
  int held = 0;  // the first layer whose MLP this producer has not yet released
  for (int64_t j = 0; j < chunks; ++j) {
    const int slot = static_cast<int>(j % kStages);
    if (j >= kStages) MbarWait(&s->empty[slot], static_cast<unsigned>(j / kStages - 1) & 1u);
    for (; held < d.layers && first_held_chunk(held) <= j; ++held) {
      while (s->mlp_released <= held) {
      }
    }
    const int64_t left = bytes - j * kStageBytes;
    const unsigned n = static_cast<unsigned>(left < kStageBytes ? left : kStageBytes);
    MbarExpectBytes(&s->full[slot], n);
    BulkCopy(ring + slot * kStageBytes, stream + j * kStageBytes, n, &s->full[slot]);
  }
}

#endif  // __CUDA_ARCH__ >= 900

// Dynamic shared memory: the ring, Smem, the input (bf16: x, or the CTA's
// SwiGLU units) and the rows (fp32: a row product's share, or every row of
// a column product's sums), in that order.
struct SmemLayout {
  int input, rows, bytes;
  __host__ __device__ SmemLayout(const PersistentDecodeDims& d, int ctas) {
    // The most units a CTA takes of `units` (GroupBegin's split).
    const auto most = [ctas](int units) { return (units + ctas - 1) / ctas; };
    const int mlp_units = most(d.Units(DecodePhase::kMlpOut));
    int widest = kDecodeSliceCols * mlp_units;
    widest = d.hidden > widest ? d.hidden : widest;
    int rows_most = d.hidden;
    for (int n :
         {most(d.Units(DecodePhase::kMixerIn)), 2 * mlp_units, most(d.Units(DecodePhase::kHead))})
      rows_most = kDecodeTileRows * n > rows_most ? kDecodeTileRows * n : rows_most;
    input = kStages * kStageBytes + static_cast<int>((sizeof(Smem) + 15) / 16 * 16);
    rows = input + (widest * 2 + 15) / 16 * 16;
    bytes = rows + rows_most * 4;
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    PersistentDecodeKernel(const __grid_constant__ PersistentDecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemLayout layout(p.dims, p.ctas);
  unsigned char* ring = smem;
  Smem* s = reinterpret_cast<Smem*>(smem + kStages * kStageBytes);
  auto* input = reinterpret_cast<__nv_bfloat16*>(smem + layout.input);
  float* rows = reinterpret_cast<float*>(smem + layout.rows);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarInit(&s->full[i], 1);
      MbarInit(&s->empty[i], kTilesPerStage);
    }
    s->mlp_released = 0;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) Produce(p, ring, s);
    return;
  }
  Consumer(p, ring, s, input, rows).Run();
#else
  (void)p;
#endif
}

}  // namespace

bool PersistentDecodeSupports(const PersistentDecodeDims& d, int ctas) {
  return ctas > 0 && d.layers > 0 && d.dk == kConsumers && d.dv % kStepColumns == 0 &&
         d.heads * d.dv / kStepColumns <= ctas && d.hidden % kDecodeTileCols == 0 &&
         d.hidden <= kMaxHidden && d.ffn % kDecodeSliceCols == 0 && d.ffn > 0 &&
         d.vocab % kDecodeTileRows == 0 && d.MixerInRows() % kDecodeTileRows == 0 &&
         d.heads * d.dk % kDecodeTileRows == 0 && d.rank > 0 && d.rank <= kMaxRank &&
         d.rank % 4 == 0 && SmemLayout(d, ctas).bytes <= 227 * 1024;
}

int PersistentDecodeCtas() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

cudaError_t ConfigurePersistentDecode(const PersistentDecodeParams& p) {
  return cudaFuncSetAttribute(PersistentDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              SmemLayout(p.dims, p.ctas).bytes);
}

cudaError_t LaunchPersistentDecode(const PersistentDecodeParams& p, cudaStream_t stream) {
  void* args[] = {const_cast<PersistentDecodeParams*>(&p)};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(PersistentDecodeKernel),
                                     dim3(p.ctas), dim3(kThreads), args,
                                     SmemLayout(p.dims, p.ctas).bytes, stream);
}

}  // namespace lair::kernels::cuda
