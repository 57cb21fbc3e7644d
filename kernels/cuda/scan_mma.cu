// The tensor-core chunked scan (scan_mma.h): one CTA of 8 warps per (sequence,
// head, dv tile of 64 or 128 columns, MmaTile says which), sequential over
// chunks of C = 64 tokens; every matmul is a bf16 mma.sync.m16n8k16 with fp32
// accumulators; the state S [dk × tile] lives in fp32 registers, and a bf16
// copy of it in shared memory is the B operand of the inter-chunk product (the
// one rounding of S, as in fla). Loads are cp.async; with two stages the next
// chunk's q, k, v and gates stream in while the current one is computed.
//
// Per chunk, with b = inclusive in-chunk cumsum of the left log-decay and the
// chunk cut into four 16-row blocks I (first row I0, last row Ie):
// Vector decay (GLA), secondary chunking, every factor ≤ 1 but one:
//   q̂_i = q_i ⊙ e^{b_i − b_I0}       k̂_j = k_j ⊙ e^{b_Je − b_j}           (stored bf16)
//   A[I,J] = (q̂_I ⊙ e^{b_I0 − b_Je}) k̂_Jᵀ   for J < I                    (mma)
//   A[I,I] = (q̂_I ⊙ e^{b_I0 − b_Ie}) k̂_Iᵀ, masked j ≤ i                   (mma)
//     — the factor e^{b_I0 − b_Ie} ≥ 1 is the block's own decay span; where
//     it exceeds e^60 the block is instead summed exactly in fp32,
//     A_ij = Σ_a q_ia k_ja e^{b_ia − b_ja}, so no exponent ever overflows.
//   o_i = Σ_j A_ij v_j + (q̂_i ⊙ e^{b_I0}) S
//   S  ← diag(e^{b_C}) S + Σ_J (k̂_J ⊙ e^{b_C − b_Je})ᵀ V_J
// Right decay (the value side: GSA's key pass, the decay backward's dq and dk
// scans), the same blocks with c = in-chunk cumsum of the right log-decay, a
// factor per output column instead of per key; A carries no decay:
//   A_ij = q_i·k_j (j ≤ i)           v̂_j = v_j ⊙ e^{c_Je − c_j}           (stored bf16)
//   o_i = (Σ_{J≤I} A_IJ (v̂_J ⊙ e^{c_I0 − c_Je}) + (q_i S) ⊙ e^{c_I0}) ⊙ e^{c_i − c_I0}
//     — the diagonal's factor e^{c_I0 − c_Ie} ≥ 1 is bounded by e^60 as above,
//     and past it that block's products are summed exactly in fp32;
//   S  ← S diag(e^{c_C}) + Σ_J K_Jᵀ (v̂_J ⊙ e^{c_C − c_Je})
// Scalar decay (simple GLA, RetNet, mLSTM), exact without sub-blocks, with the
// stabilizer m_i = b_i + max(m_prev, max_{j≤i}(lw_j − b_j)) of scan.cu:
//   A_ij = (q_i·k_j) e^{b_i − b_j + lw_j − m_i}  (j ≤ i)
//   o_i = Σ_j A_ij v_j + e^{b_i + m_prev − m_i} q_iᵀ S, normalized as scan.h says
//   S  ← e^{b_C + m_prev − m_C} S + Σ_j (k_j e^{b_C − b_j + lw_j − m_C}) v_jᵀ
// With one more key feature (kScalarExtra: q^e, k^e per token), A_ij gains
// q^e_i k^e_j under the same factor, S a row r ← e^{b_C + m_prev − m_C} r +
// Σ_j k^e_j e^{b_C − b_j + lw_j − m_C} v_j, and q_iᵀS the term q^e_i r; each
// output row may also be dotted with a row of another operand (row_dots).
// Scaled operands are rounded to bf16 (f16 and f32 inputs too: the exponent
// range of the rescaled operands needs bf16's), and so is A before A·V.
//
// The two-pass scan splits that loop where it is sequential: the state pass
// runs only the S update and stores the bf16 copy of S entering each chunk;
// the output pass then takes every chunk in a CTA of its own, loading that
// copy where the scan would have rounded it. Both passes make the products of
// the one-pass scan, in the same order, so the outputs are the same.
#include <cstdint>
#include <cstring>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma_fragments.cuh"
#include "kernels/cuda/scan_mma.h"
#include "kernels/cuda/scan_wgmma.h"

namespace lair::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

// What one launch of the kernel does (scan_mma.h):
//   kFused    the scan: per chunk, outputs, then the state update;
//   kStates   the state pass: per chunk, stores S entering it, then updates S;
//   kOutputs  the output pass: one chunk per CTA, from the stored S.
enum class MmaPass { kFused, kStates, kOutputs };

// Where the decay acts: one log value per token (scalar), per key (left
// vector) or per value column (right vector); kScalarExtra is the scalar
// kind with one more key feature (ScanParams::extra_key), compiled apart so
// that the other scans carry none of its code.
enum class MmaDecay { kScalar, kLeft, kRight, kScalarExtra };
constexpr __host__ __device__ bool IsScalar(MmaDecay d) {
  return d == MmaDecay::kScalar || d == MmaDecay::kScalarExtra;
}

// Parts of the chunk's rows that S's extra row is summed over at the end of
// a chunk, one a quarter of the threads; the next chunk adds them up.
constexpr int kExtraParts = 4;

struct MmaTile {
  static constexpr int kChunk = 64;  // C
  static constexpr int kBlock = 16;  // secondary chunk: one mma row block
  static constexpr int kBlocks = kChunk / kBlock;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMaxDk = 256;
  // Rows of bf16 padded by 8: a row stride ≡ 4 words (mod 8) puts the eight
  // 16-byte rows of an ldmatrix phase in distinct banks.
  static constexpr int kPad = 8;
  static constexpr int kLdA = kChunk + kPad;
  // Largest in-block decay span (−Σ log-decay over a 16-row block) taken by
  // the diagonal mma: operands stay within e^{±60}, normal in bf16 and fp32.
  static constexpr float kMaxSpan = 60.0f;
  static_assert(kWarps == 2 * kBlocks, "A and o phases: two warps per 16-row block");
  static_assert(kMaxDk == 2 * 8 * kBlock, "state: at most 2 m-tiles per warp");

  // Per (dk, decay kind, pass): dk ≤ 128 holds one m-tile of S per warp,
  // dk ≤ 256 two. The sequential passes at left vector decay and dk ≤ 128
  // take 128 dv columns and two load stages (its gate rows make the loads the
  // larger share; measured faster); the others take 64 columns and one stage,
  // and the scalar kind at dk ≤ 128 runs two CTAs per SM instead (measured
  // faster than prefetching, than 128 columns per CTA in 8 or 16 warps, and
  // than bulk copies: docs/benchmarks.md; it fits 128 registers, with nothing
  // to spare). The state pass keeps no q, so the scalar kind there also fits two
  // stages at two CTAs per SM. The output pass of the two-pass scan holds no
  // state and walks one chunk: 64 columns, one stage, two CTAs per SM where
  // shared memory allows.
  static constexpr __host__ __device__ int StateTiles(int dk) { return dk <= 128 ? 1 : 2; }
  static constexpr __host__ __device__ bool Wide(int state_tiles, MmaDecay decay, MmaPass pass) {
    return decay == MmaDecay::kLeft && state_tiles == 1 && pass != MmaPass::kOutputs;
  }
  static constexpr __host__ __device__ int TileV(int state_tiles, MmaDecay decay, MmaPass pass) {
    return Wide(state_tiles, decay, pass) ? 128 : 64;
  }
  static constexpr __host__ __device__ int Stages(int state_tiles, MmaDecay decay, MmaPass pass) {
    return Wide(state_tiles, decay, pass) || (pass == MmaPass::kStates && state_tiles == 1) ? 2 : 1;
  }
  static constexpr __host__ __device__ int MinBlocks(int state_tiles, MmaDecay decay,
                                                     MmaPass pass) {
    if (pass == MmaPass::kOutputs) return state_tiles == 1 ? 2 : 1;
    return IsScalar(decay) && state_tiles == 1 ? 2 : 1;
  }
  // Columns of a chunk's gate rows: the keys (left), the tile (right), or one.
  static constexpr __host__ __device__ int GateWidth(int dk, MmaDecay decay, int tile_v) {
    return decay == MmaDecay::kLeft ? dk : decay == MmaDecay::kRight ? tile_v : 1;
  }
};

// Byte offsets of the dynamic shared memory of one CTA (16-byte aligned).
struct MmaLayout {
  int ldq = 0, ldv = 0;                 // bf16 row strides of q/k and of v/S
  int stage = 0;                        // first load stage; stage s at stage + s·stage_bytes
  int stage_bytes = 0;                  // q, k, v, gates of one chunk:
  int k_off = 0, v_off = 0, g_off = 0;  // ... offsets in a stage (q at 0)
  int w_off = 0;                        // ... and the extra kind's dot operand tile
  int s = 0, a = 0, tab = 0, flags = 0, bytes = 0;

  constexpr __host__ __device__ MmaLayout(int dk, MmaDecay decay, MmaPass pass) {
    using T = MmaTile;
    const int tiles = T::StateTiles(dk);
    const int tile_v = T::TileV(tiles, decay, pass);
    const int gw = T::GateWidth(dk, decay, tile_v);
    const bool scalar = IsScalar(decay), extra = decay == MmaDecay::kScalarExtra;
    ldq = dk + T::kPad;
    ldv = tile_v + T::kPad;
    // q̂ (left) or q, bf16 [C][ldq]; the state pass reads no q.
    k_off = pass == MmaPass::kStates ? 0 : T::kChunk * ldq * 2;
    v_off = k_off + T::kChunk * ldq * 2;  // k̂ (left) or k, bf16 [C][ldq]
    g_off = v_off + T::kChunk * ldv * 2;  // v̂ (right) or v tile, bf16 [C][ldv]
    // b or c [C][gw] (vector kinds), or b, lw [C] (scalar), then the extra
    // key feature's q and k [C]
    w_off = g_off + (scalar ? (extra ? 4 : 2) * T::kChunk : T::kChunk * gw) * 4;
    // the extra kind's ScanParams::dot_with tile, bf16 [C][ldv]
    stage_bytes = w_off + (extra ? T::kChunk * ldv * 2 : 0);
    stage = Take(T::Stages(tiles, decay, pass) * stage_bytes);
    s = Take(dk * ldv * 2);             // S, bf16 [dk][ldv]
    a = Take(T::kChunk * T::kLdA * 2);  // masked A, bf16 [C][kLdA]
    // vector kinds: e^{b_I0} [4][gw], e^{b_C − b_Je} [4][gw], e^{b_C} [gw];
    // scalar: m, e^{b_i + m_prev − m_i}, column weights, den, y [C] and n
    // [dk]; with the extra key feature, its k times the column weight [C],
    // S's extra row [tile_v] and that row's parts [kExtraParts][tile_v].
    tab = Take((scalar ? 5 * T::kChunk + dk + (extra ? T::kChunk + (1 + kExtraParts) * tile_v : 0)
                       : 9 * gw) *
               4);
    flags = Take(T::kBlocks * 4);
  }

 private:
  constexpr __host__ __device__ int Take(int n) {
    const int at = bytes;
    bytes += (n + 15) / 16 * 16;
    return at;
  }
};
static_assert(MmaTile::kChunk * MmaTile::kLdA * 2 % 16 == 0 && MmaTile::kPad % 8 == 0,
              "16-byte aligned rows and regions");

// An A fragment holds rows (g, g+8) × columns (2t, 2t+1, 2t+8, 2t+9) as
// registers {g: 2t}, {g+8: 2t}, {g: 2t+8}, {g+8: 2t+8}.
__device__ __forceinline__ void ScaleCols(uint32_t (&r)[4], const float (&f)[4]) {
  r[0] = Scale2(r[0], f[0], f[1]);
  r[1] = Scale2(r[1], f[0], f[1]);
  r[2] = Scale2(r[2], f[2], f[3]);
  r[3] = Scale2(r[3], f[2], f[3]);
}
// Row g + 8·half of an A fragment dotted with weights f of its four columns
// (f[0..3] for columns 2t, 2t+1, 2t+8, 2t+9, as in ScaleCols), in fp32.
__device__ __forceinline__ float RowDot(const uint32_t (&r)[4], int half, const float (&f)[4]) {
  __nv_bfloat162 lo, hi;
  memcpy(&lo, &r[half], 4);
  memcpy(&hi, &r[half + 2], 4);
  const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
  return a.x * f[0] + a.y * f[1] + b.x * f[2] + b.y * f[3];
}
// The B fragments of two n-tiles from one Ldsm4T (registers 0-1: tile n,
// 2-3: tile n + 1; a lane's registers hold its column g of each): column g
// of tile n times f0, of tile n + 1 times f1.
__device__ __forceinline__ void ScaleTilePair(uint32_t (&b)[4], float f0, float f1) {
  b[0] = Scale2(b[0], f0, f0), b[1] = Scale2(b[1], f0, f0);
  b[2] = Scale2(b[2], f1, f1), b[3] = Scale2(b[3], f1, f1);
}
__device__ __forceinline__ void ScaleRows(uint32_t (&r)[4], float fg, float fg8) {
  r[0] = Scale2(r[0], fg, fg);
  r[1] = Scale2(r[1], fg8, fg8);
  r[2] = Scale2(r[2], fg, fg);
  r[3] = Scale2(r[3], fg8, fg8);
}

// Where chunk c of sequence seq keeps its state in a two-pass scan's buffer:
// ⌊bos/C⌋ + seq + c never collides with another sequence's chunks (sequence s
// has ⌈len/C⌉ ≤ ⌊len/C⌋ + 1 of them) and stays below ⌊N/C⌋ + num_seqs.
__device__ __forceinline__ int64_t ChunkIndex(int64_t bos, int seq, int chunk) {
  return bos / MmaTile::kChunk + seq + chunk;
}

// kDk > 0 compiles the key width in (p.dk is then kDk): the layout's offsets
// fold and the loops over keys have a known trip count.
template <MmaDecay kDecay, int kStateTiles, MmaPass kPass, int kDk>
__global__ void __launch_bounds__(MmaTile::kThreads, MmaTile::MinBlocks(kStateTiles, kDecay, kPass))
    ScanMmaKernel(const ScanParams p, bf16* chunk_states) {
  using T = MmaTile;
  constexpr int C = T::kChunk;
  constexpr bool kVector = kDecay == MmaDecay::kLeft;  // per-key decay
  constexpr bool kRight = kDecay == MmaDecay::kRight;  // per-column decay
  constexpr bool kScalar = IsScalar(kDecay);
  constexpr bool kExtra = kDecay == MmaDecay::kScalarExtra;  // one more key feature
  constexpr int TV = T::TileV(kStateTiles, kDecay, kPass);   // dv columns per CTA
  constexpr int kStages = T::Stages(kStateTiles, kDecay, kPass);
  constexpr bool kCarry = kPass != MmaPass::kOutputs;  // S in registers, updated per chunk
  constexpr bool kEmit = kPass != MmaPass::kStates;    // outputs written
  constexpr int kNt = TV / 8;                          // n-tiles of S (every warp holds all)
  constexpr int kOn = TV / 16;                         // n-tiles of o per warp
  constexpr unsigned kAll = 0xffffffffu;
  extern __shared__ __align__(16) unsigned char smem[];
  const int dk = kDk > 0 ? kDk : p.dk;
  const MmaLayout lay(dk, kDecay, kPass);
  const int ldv = lay.ldv;
  bf16* ss = reinterpret_cast<bf16*>(smem + lay.s);
  bf16* as = reinterpret_cast<bf16*>(smem + lay.a);
  float* tab = reinterpret_cast<float*>(smem + lay.tab);
  int* span_over = reinterpret_cast<int*>(smem + lay.flags);
  const int ldq = lay.ldq;
  // Columns of the vector kinds' gate rows and tables (the keys or the tile).
  const int gw = T::GateWidth(dk, kDecay, TV);
  // vector tables (c for b on the right)
  float* eb0 = tab;            // [4][gw] e^{b_I0}
  float* ebl = tab + 4 * gw;   // [4][gw] e^{b_C − b_Je}
  float* sdec = tab + 8 * gw;  // [gw]    e^{b_C}
  // scalar tables
  float* ms = tab;                      // [C] m_i
  float* coef = ms + C;                 // [C] e^{b_i + m_prev − m_i}
  float* wj = coef + C;                 // [C] e^{b_C − b_j + lw_j − m_C}
  float* den = wj + C;                  // [C] q'ᵀn
  float* ycol = den + C;                // [C] y_j = b_j − lw_j
  float* nn = ycol + C;                 // [dk] n
  float* extra_w = nn + dk;             // [C] the extra k' times the column weight
  float* extra_row = extra_w + C;       // [TV] S's extra row entering the chunk
  float* extra_parts = extra_row + TV;  // [kExtraParts][TV] its sums over the chunk

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int h = blockIdx.y, seq = blockIdx.z;
  // The output pass's x index is chunk · tiles + tile.
  const int tiles = (p.dv + TV - 1) / TV;
  const int tile = kCarry ? blockIdx.x : blockIdx.x % tiles;
  const int e0 = tile * TV;
  const int tv = min(TV, p.dv - e0);
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const int num_chunks = (len + C - 1) / C;
  const int first_chunk = kCarry ? 0 : blockIdx.x / tiles;
  const int end_chunk = kCarry ? num_chunks : min(first_chunk + 1, num_chunks);
  // The whole CTA leaves for a chunk past its sequence (an empty sequence
  // still carries its state through in the other passes).
  if (!kCarry && first_chunk >= end_chunk) return;
  // This head's [dk][dv] state entering chunk c in the two-pass buffer.
  auto chunk_state = [&](int c) {
    return chunk_states + (ChunkIndex(bos, seq, c) * p.heads + h) * dk * p.dv;
  };
  // The normalizer n: carried where a norm reads it or n_final wants it (the
  // one-pass scan alone has either).
  const bool carry_n =
      kScalar && kPass == MmaPass::kFused && (p.n_final != nullptr || p.norm != NormKind::kNone);
  const bool norm = kScalar && kPass == MmaPass::kFused && p.norm != NormKind::kNone;
  const float qk_scale = p.q_scale * p.k_scale;
  // Outputs staged through shared memory (step 5): 16-bit, aligned, and a q
  // row holds a tile row.
  const bool stage_out = (p.o_type == ElemType::kBF16 || p.o_type == ElemType::kF16) &&
                         reinterpret_cast<uintptr_t>(p.o) % 16 == 0 && dk >= TV;
  const int64_t head_off = static_cast<int64_t>(h) * dk * p.dv;
  // Which loads go through cp.async (bf16 operands, aligned log-valued vector gates).
  const bool qk_async = p.q.type == ElemType::kBF16 && p.k.type == ElemType::kBF16;
  const bool v_async = p.v.type == ElemType::kBF16;
  const LogGate& gate = kRight ? p.right : p.left;     // the decay's gate
  const int gate_h = kRight ? h / p.v_head_share : h;  // its head (value side: v's)
  const int gate_col0 = kRight ? e0 : 0;               // its first column in this CTA
  const int gate_cols = kRight ? tv : dk;              // and how many are live
  const bool gate_async =
      !kScalar && gate.ptr != nullptr && reinterpret_cast<uintptr_t>(gate.ptr) % 16 == 0 &&
      gate.fn == GateFn::kIdentity && gate.token_stride % 4 == 0 && gate.head_stride % 4 == 0;

  // State accumulators: m-tile w + 8r (rows a), n-tile n (cols e) of S; and
  // n at rows a = 16(w + 8r) + g + 8·half, the same in the four lanes of g.
  float sacc[kStateTiles][kNt][4];
  float nreg[kStateTiles][2] = {};
  auto n_row = [&](int r, int half) { return 16 * (warp + 8 * r) + g + 8 * half; };
  if constexpr (kCarry) {
    const int slot = p.s_init.slot ? p.s_init.slot[seq] : seq;
    const float* base =
        p.s_init.ptr ? p.s_init.ptr + slot * p.s_init.slot_stride + head_off : nullptr;
#pragma unroll
    for (int r = 0; r < kStateTiles; ++r)
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int a = 16 * (warp + 8 * r) + g + (c >= 2 ? 8 : 0), e = 8 * n + 2 * t4 + (c & 1);
          sacc[r][n][c] = (base && a < dk && e < tv)
                              ? base[static_cast<int64_t>(a) * p.s_init.stride_a +
                                     static_cast<int64_t>(e0 + e) * p.s_init.stride_b]
                              : 0.0f;
        }
    if (carry_n && p.n_init) {
#pragma unroll
      for (int r = 0; r < kStateTiles; ++r)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int a = n_row(r, half);
          if (a < dk) nreg[r][half] = p.n_init[(static_cast<int64_t>(slot) * p.heads + h) * dk + a];
        }
    }
  }
  // The bf16 copy of S (step 1 of each chunk, while its copies are in flight).
  auto store_state_copy = [&] {
#pragma unroll
    for (int r = 0; r < kStateTiles; ++r) {
      const int a = 16 * (warp + 8 * r) + g;
      if (a >= dk) continue;
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        const int e = 8 * n + 2 * t4;
        *reinterpret_cast<__nv_bfloat162*>(ss + a * ldv + e) =
            __floats2bfloat162_rn(sacc[r][n][0], sacc[r][n][1]);
        *reinterpret_cast<__nv_bfloat162*>(ss + (a + 8) * ldv + e) =
            __floats2bfloat162_rn(sacc[r][n][2], sacc[r][n][3]);
      }
    }
  };
  // n entering the chunk, for q'ᵀn (step 1 too).
  auto store_n_copy = [&] {
#pragma unroll
    for (int r = 0; r < kStateTiles; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int a = n_row(r, half);
        if (t4 == 0 && a < dk) nn[a] = nreg[r][half];
      }
  };
  // A zeroed once: entries right of the diagonal blocks stay 0.
  for (int idx = tid; idx < C * T::kLdA; idx += T::kThreads) as[idx] = __float2bfloat16_rn(0.0f);
  if constexpr (kExtra) {
    if (tid < TV) extra_row[tid] = 0.0f;
  }
  float m_prev = 0.0f;
  if (p.stabilize && p.m_init) {
    const int slot = p.s_init.slot ? p.s_init.slot[seq] : seq;
    m_prev = p.m_init[static_cast<int64_t>(slot) * p.heads + h];
  }

  // Stage st of the load buffers: q, k, v (bf16) and the gates (fp32).
  auto stage_base = [&](int st) { return smem + lay.stage + st * lay.stage_bytes; };
  // 1. Copies of chunk `chunk` into stage st, committed as one cp.async group
  //    (operands that need converting are stored directly); rows past the
  //    chunk's length are zero.
  auto issue = [&](int chunk, int st) {
    const int c0 = chunk * C, lc = min(C, len - c0);
    const int tok0 = p.reverse ? len - 1 - c0 : c0, dir = p.reverse ? -1 : 1;
    unsigned char* base = stage_base(st);
    bf16* qd = reinterpret_cast<bf16*>(base);
    bf16* kd = reinterpret_cast<bf16*>(base + lay.k_off);
    bf16* vd = reinterpret_cast<bf16*>(base + lay.v_off);
    float* gd = reinterpret_cast<float*>(base + lay.g_off);
    for (GridWalk w(tid, dk / 8, T::kThreads); w.row < C; w.Next()) {
      const int i = w.row, c = 8 * w.col;
      const bool live = i < lc;
      const int64_t off = live ? ((bos + tok0 + dir * i) * p.heads + h) * dk + c : 0;
      if (qk_async) {  // the state pass (!kEmit) reads no q
        if (kEmit) CpAsync16(qd + i * lay.ldq + c, static_cast<const bf16*>(p.q.ptr) + off, live);
        CpAsync16(kd + i * lay.ldq + c, static_cast<const bf16*>(p.k.ptr) + off, live);
      } else {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        if (kEmit) *reinterpret_cast<uint4*>(qd + i * lay.ldq + c) = live ? Load8(p.q, off) : zero;
        *reinterpret_cast<uint4*>(kd + i * lay.ldq + c) = live ? Load8(p.k, off) : zero;
      }
    }
    for (int idx = tid; idx < C * (TV / 8); idx += T::kThreads) {
      const int i = idx / (TV / 8), c = 8 * (idx % (TV / 8));
      const bool live = i < lc && c < tv;
      // v is [N, heads / share, dv]: head h reads head h / share.
      const int64_t off =
          live ? ((bos + tok0 + dir * i) * (p.heads / p.v_head_share) + h / p.v_head_share) * p.dv +
                     e0 + c
               : 0;
      if (v_async) {
        CpAsync16(vd + i * ldv + c, static_cast<const bf16*>(p.v.ptr) + off, live);
      } else {
        *reinterpret_cast<uint4*>(vd + i * ldv + c) =
            live ? Load8(p.v, off) : make_uint4(0, 0, 0, 0);
      }
    }
    if constexpr (kExtra) {
      // The tile of ScanParams::dot_with, shaped as o.
      bf16* wd = reinterpret_cast<bf16*>(base + lay.w_off);
      for (int idx = tid; p.row_dots && idx < C * (TV / 8); idx += T::kThreads) {
        const int i = idx / (TV / 8), c = 8 * (idx % (TV / 8));
        const bool live = i < lc && c < tv;
        const int64_t off = live ? ((bos + tok0 + dir * i) * p.heads + h) * p.dv + e0 + c : 0;
        if (p.dot_with.type == ElemType::kBF16) {
          CpAsync16(wd + i * ldv + c, static_cast<const bf16*>(p.dot_with.ptr) + off, live);
        } else {
          *reinterpret_cast<uint4*>(wd + i * ldv + c) =
              live ? Load8(p.dot_with, off) : make_uint4(0, 0, 0, 0);
        }
      }
    }
    if constexpr (!kScalar) {
      if (gate_async) {
        // Gate rows as GateAt reads them (shift: row t + 1, none past the end).
        for (GridWalk w(tid, gw / 4, T::kThreads); w.row < C; w.Next()) {
          const int i = w.row, a = 4 * w.col;
          const int src = tok0 + dir * i + (gate.shift ? 1 : 0);
          const bool live = i < lc && src < len && a < gate_cols;
          const int64_t off = live ? (bos + src) * gate.token_stride +
                                         static_cast<int64_t>(gate_h) * gate.head_stride +
                                         gate_col0 + a
                                   : 0;
          CpAsync16(gd + i * gw + a, gate.ptr + off, live);
        }
      } else {
        for (int idx = tid; idx < C * gw; idx += T::kThreads) {
          const int i = idx / gw, a = idx % gw;
          gd[idx] = i < lc && a < gate_cols
                        ? GateAt(gate, bos, len, tok0 + dir * i, gate_h, gate_col0 + a)
                        : 0.0f;
        }
      }
    } else {
      for (int i = tid; i < C; i += T::kThreads) {
        const bool live = i < lc;
        gd[i] = live ? GateAt(p.left, bos, len, tok0 + dir * i, h, 0) : 0.0f;
        gd[C + i] = (live && p.key_weight.ptr)
                        ? GateAt(p.key_weight, bos, len, tok0 + dir * i, h, 0)
                        : 0.0f;
        if constexpr (kExtra) {
          // The extra feature: 1 where not given, and k' 0 past the chunk.
          const int64_t at = (bos + tok0 + dir * i) * p.heads + h;
          gd[2 * C + i] = live && p.extra_q ? p.extra_q[at] : 1.0f;
          gd[3 * C + i] = !live ? 0.0f : p.extra_k ? p.extra_k[at] : 1.0f;
        }
      }
    }
    CpAsyncCommit();
  };

  if constexpr (!kCarry) {
    // The stored bf16 S entering this chunk, in the group of its first copies.
    const bf16* src = chunk_state(first_chunk);
    for (int idx = tid; idx < dk * (TV / 8); idx += T::kThreads) {
      const int a = idx / (TV / 8), e = 8 * (idx % (TV / 8));
      const bool live = e < tv;
      CpAsync16(ss + a * ldv + e, src + (live ? static_cast<int64_t>(a) * p.dv + e0 + e : 0), live);
    }
  }
  if (first_chunk < end_chunk) issue(first_chunk, 0);
  for (int chunk = first_chunk; chunk < end_chunk; ++chunk) {
    const int c0 = chunk * C;
    const int lc = min(C, len - c0);
    const int tok0 = p.reverse ? len - 1 - c0 : c0;  // local token of chunk row 0
    const int dir = p.reverse ? -1 : 1;
    auto row_of = [&](int i) { return bos + tok0 + dir * i; };  // packed row of chunk row i
    const int st = kStages == 2 ? chunk & 1 : 0;
    bf16* qs = reinterpret_cast<bf16*>(stage_base(st));
    bf16* ks = reinterpret_cast<bf16*>(stage_base(st) + lay.k_off);
    bf16* vs = reinterpret_cast<bf16*>(stage_base(st) + lay.v_off);
    float* bl = reinterpret_cast<float*>(stage_base(st) + lay.g_off);  // gates, then b
    float* lws = bl + C;                                               // scalar: lw
    [[maybe_unused]] const float* extra_q = bl + 2 * C;  // the extra key feature of q'
    [[maybe_unused]] const float* extra_k = bl + 3 * C;  // and of k'

    // The next chunk's copies go out first (its stage was last read before the
    // previous chunk's closing barrier), then this chunk's must have landed.
    if constexpr (kStages == 2) {
      if (chunk + 1 < end_chunk) {
        issue(chunk + 1, st ^ 1);
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
    } else {
      if (chunk > first_chunk) issue(chunk, 0);
      CpAsyncWait<0>();
    }
    // The state pass without a chunk-state buffer wants s_final alone.
    if constexpr (kCarry) {
      if (kPass == MmaPass::kFused || chunk_states) store_state_copy();
    }
    if (carry_n) store_n_copy();
    if constexpr (kExtra) {
      // S's extra row past the last chunk: decayed (coef is still that
      // chunk's), plus its parts.
      if (chunk > first_chunk && tid < TV) {
        float row = extra_row[tid] * coef[C - 1];
#pragma unroll
        for (int part = 0; part < kExtraParts; ++part) row += extra_parts[part * TV + tid];
        extra_row[tid] = row;
      }
    }
    if (!kScalar && tid < T::kBlocks) span_over[tid] = 0;
    __syncthreads();
    if (kPass == MmaPass::kStates && chunk_states) {
      // The copy goes out in 16-byte rows; the next write of ss is past two barriers.
      bf16* dst = chunk_state(chunk);
      for (int idx = tid; idx < dk * (TV / 8); idx += T::kThreads) {
        const int a = idx / (TV / 8), e = 8 * (idx % (TV / 8));
        if (e < tv)
          *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(a) * p.dv + e0 + e) =
              *reinterpret_cast<const uint4*>(ss + a * ldv + e);
      }
    }

    // 2. In-chunk cumsums and the decay tables.
    if constexpr (!kScalar) {
      for (int a = tid; a < gw; a += T::kThreads) {
        float run = 0.0f;
        for (int i0 = 0; i0 < C; i0 += T::kBlock) {
          float x[T::kBlock];  // loads of a block issued before its dependent adds
#pragma unroll
          for (int i = 0; i < T::kBlock; ++i) x[i] = bl[(i0 + i) * gw + a];
#pragma unroll
          for (int i = 0; i < T::kBlock; ++i) {
            run += x[i];
            bl[(i0 + i) * gw + a] = run;
          }
        }
        sdec[a] = __expf(run);
#pragma unroll
        for (int blk = 0; blk < T::kBlocks; ++blk) {
          const float first = bl[blk * T::kBlock * gw + a];
          const float last = bl[(blk * T::kBlock + T::kBlock - 1) * gw + a];
          eb0[blk * gw + a] = __expf(first);
          ebl[blk * gw + a] = __expf(run - last);
          if (first - last > T::kMaxSpan) span_over[blk] = 1;
        }
      }
    } else {
      if (warp == 0) {
        // Lane l owns rows 2l and 2l+1: warp scans for b (sum) and m (max).
        const int i0 = 2 * lane, i1 = i0 + 1;
        const float x0 = bl[i0], x1 = bl[i1];
        float incl = x0 + x1;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const float y = __shfl_up_sync(kAll, incl, off);
          if (lane >= off) incl += y;
        }
        const float b1 = incl, b0 = incl - x1;
        const float b_last = __shfl_sync(kAll, b1, 31);
        float m0 = 0.0f, m1 = 0.0f;
        if (p.stabilize) {
          const float y0 = i0 < lc ? lws[i0] - b0 : -INFINITY;
          const float y1 = fmaxf(y0, i1 < lc ? lws[i1] - b1 : -INFINITY);
          float run = y1;
#pragma unroll
          for (int off = 1; off < 32; off <<= 1) {
            const float z = __shfl_up_sync(kAll, run, off);
            if (lane >= off) run = fmaxf(run, z);
          }
          float before = __shfl_up_sync(kAll, run, 1);
          if (lane == 0) before = -INFINITY;
          before = fmaxf(before, m_prev);
          m0 = b0 + fmaxf(before, y0);
          m1 = b1 + fmaxf(before, y1);
        }
        const float m_last = __shfl_sync(kAll, m1, 31);
        const float mp = p.stabilize ? m_prev : 0.0f;
        bl[i0] = b0;
        bl[i1] = b1;
        ms[i0] = m0;
        ms[i1] = m1;
        coef[i0] = __expf(b0 + mp - m0);
        coef[i1] = __expf(b1 + mp - m1);
        wj[i0] = i0 < lc ? __expf(b_last - b0 + lws[i0] - m_last) * p.k_scale : 0.0f;
        wj[i1] = i1 < lc ? __expf(b_last - b1 + lws[i1] - m_last) * p.k_scale : 0.0f;
        // Columns past lc hold k = 0, and their factor is not bounded by m_i: 0.
        ycol[i0] = i0 < lc ? b0 - lws[i0] : INFINITY;
        ycol[i1] = i1 < lc ? b1 - lws[i1] : INFINITY;
        den[i0] = 0.0f;  // the in-chunk part of q'ᵀn, summed in step 4
        den[i1] = 0.0f;
        if constexpr (kExtra) {
          extra_w[i0] = extra_k[i0] * wj[i0];
          extra_w[i1] = extra_k[i1] * wj[i1];
        }
      }
    }
    __syncthreads();

    // 3. Left: rescale q and k in place. Right: v.
    if constexpr (kVector) {
      // A thread keeps one key pair (a, a + 1) and takes every row_step-th
      // row from r0, so its block's first and last b stay in registers
      // (threads past pairs · row_step take none).
      const int pairs = dk / 2, row_step = T::kThreads / pairs;
      const int a = 2 * (tid % pairs), r0 = tid / pairs;
      float2 first{}, last{};
      int loaded = -1;  // the block whose first and last b are held
#pragma unroll 4
      for (int i = r0 < row_step ? r0 : C; i < C; i += row_step) {
        const int blk = i / T::kBlock;
        if (blk != loaded) {
          first = *reinterpret_cast<const float2*>(bl + blk * T::kBlock * dk + a);
          last = *reinterpret_cast<const float2*>(bl + (blk * T::kBlock + T::kBlock - 1) * dk + a);
          loaded = blk;
        }
        const float2 bi = *reinterpret_cast<const float2*>(bl + i * dk + a);
        __nv_bfloat162* qp = reinterpret_cast<__nv_bfloat162*>(qs + i * ldq + a);
        __nv_bfloat162* kp = reinterpret_cast<__nv_bfloat162*>(ks + i * ldq + a);
        if constexpr (kEmit) {
          const float2 qv = __bfloat1622float2(*qp);
          *qp = __floats2bfloat162_rn(qv.x * p.q_scale * __expf(bi.x - first.x),
                                      qv.y * p.q_scale * __expf(bi.y - first.y));
        }
        const float2 kv = __bfloat1622float2(*kp);
        *kp = __floats2bfloat162_rn(kv.x * p.k_scale * __expf(last.x - bi.x),
                                    kv.y * p.k_scale * __expf(last.y - bi.y));
      }
    } else if constexpr (kRight) {
      for (int idx = tid; idx < C * TV / 2; idx += T::kThreads) {
        const int j = idx / (TV / 2), e = 2 * (idx % (TV / 2));
        const float* c_last = bl + ((j / T::kBlock) * T::kBlock + T::kBlock - 1) * TV;
        const float* cj = bl + j * TV;
        __nv_bfloat162* vp = reinterpret_cast<__nv_bfloat162*>(vs + j * ldv + e);
        const float2 vv = __bfloat1622float2(*vp);
        *vp = __floats2bfloat162_rn(vv.x * p.k_scale * __expf(c_last[e] - cj[e]),
                                    vv.y * p.k_scale * __expf(c_last[e + 1] - cj[e + 1]));
      }
    }
    if constexpr (!kScalar) __syncthreads();  // scalar decay: nothing written in step 3

    // 4. A, masked, to bf16: row block I has the 2(I+1) n-tiles of 8 columns
    //    that reach the diagonal, 20 in all. Warps 0-3 take three of them and
    //    warps 4-7 two, so each scheduler (warps w and w + 4) has five:
    //      warp   0      1      2      3      4      5      6      7
    //      I      3      3      2      2      3      1      1      0
    //      tiles  0-2    3-5    0-2    3-5    6-7    0-1    2-3    0-1
    if constexpr (kEmit) {
      static_assert(T::kWarps == 8 && T::kBlocks == 4, "the A tile table");
      const int blk = (0x01132233 >> (4 * warp)) & 0xf;
      const int nt0 = (0x02063030 >> (4 * warp)) & 0xf;
      const int count = warp < 4 ? 3 : 2;
      float acc[3][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < dk; k0 += 16) {
        uint32_t qa[4];
        Ldsm4(qa, qs + (16 * blk + (lane & 15)) * ldq + k0 + 8 * (lane >> 4));
        uint32_t qj[4] = {qa[0], qa[1], qa[2], qa[3]};
        int scaled_for = -1;
#pragma unroll
        for (int n = 0; n < 3; ++n) {
          if (n >= count) break;
          const int nt = nt0 + n, jb = nt / 2;
          if constexpr (kVector) {
            if (jb == blk && span_over[blk]) continue;  // exact block below
            if (jb != scaled_for) {
              // q̂ ⊙ e^{b_I0 − b_Je} for the four columns this lane holds.
              const float* b_first = bl + blk * T::kBlock * dk + k0 + 2 * t4;
              const float* b_last = bl + (jb * T::kBlock + T::kBlock - 1) * dk + k0 + 2 * t4;
              const float f[4] = {__expf(b_first[0] - b_last[0]), __expf(b_first[1] - b_last[1]),
                                  __expf(b_first[8] - b_last[8]), __expf(b_first[9] - b_last[9])};
              qj[0] = qa[0], qj[1] = qa[1], qj[2] = qa[2], qj[3] = qa[3];
              ScaleCols(qj, f);
              scaled_for = jb;
            }
          }
          uint32_t kb[2];
          Ldsm2(kb, ks + (8 * nt + (lane & 7)) * ldq + k0 + 8 * ((lane >> 3) & 1));
          Mma(acc[n], qj, kb[0], kb[1]);
        }
      }
      float row_sum[2] = {0.0f, 0.0f};
      // Scalar: A_ij's factor e^{b_i − b_j + lw_j − m_i} = e^{x_i − y_j}, with
      // x_i = b_i − m_i for this lane's two rows and y_j from step 2.
      [[maybe_unused]] float xi[2] = {}, qe[2] = {};
      if constexpr (kScalar) {
        xi[0] = bl[16 * blk + g] - ms[16 * blk + g];
        xi[1] = bl[16 * blk + g + 8] - ms[16 * blk + g + 8];
        if constexpr (kExtra) qe[0] = extra_q[16 * blk + g], qe[1] = extra_q[16 * blk + g + 8];
      }
#pragma unroll
      for (int n = 0; n < 3; ++n) {
        if (n >= count) break;
        const int nt = nt0 + n;
        if (kVector && nt / 2 == blk && span_over[blk]) continue;
        [[maybe_unused]] float2 yj = {}, kej = {};
        if constexpr (kScalar) {
          yj = *reinterpret_cast<const float2*>(ycol + 8 * nt + 2 * t4);
          if constexpr (kExtra) kej = *reinterpret_cast<const float2*>(extra_k + 8 * nt + 2 * t4);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * blk + g + 8 * half, j = 8 * nt + 2 * t4;
          float v0 = j <= i ? acc[n][2 * half] : 0.0f;
          float v1 = j + 1 <= i ? acc[n][2 * half + 1] : 0.0f;
          if constexpr (kRight) {
            v0 *= p.q_scale;  // k_scale is in v̂
            v1 *= p.q_scale;
          } else if constexpr (kScalar) {
            // Selected after the product: past the diagonal e^{x_i − y_j} may be inf.
            v0 = j <= i ? (v0 + qe[half] * kej.x) * qk_scale * __expf(xi[half] - yj.x) : 0.0f;
            v1 = j + 1 <= i ? (v1 + qe[half] * kej.y) * qk_scale * __expf(xi[half] - yj.y) : 0.0f;
            row_sum[half] += v0 + v1;
          }
          *reinterpret_cast<__nv_bfloat162*>(as + i * T::kLdA + j) = __floats2bfloat162_rn(v0, v1);
        }
      }
      if (norm) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float s = row_sum[half];
          s += __shfl_xor_sync(kAll, s, 1);
          s += __shfl_xor_sync(kAll, s, 2);
          if (t4 == 0) atomicAdd(&den[16 * blk + g + 8 * half], s);
        }
      }
      if constexpr (kVector) {
        // Diagonal blocks whose decay span is too wide for one mma: exact fp32,
        // one (i, j) pair per thread, raw q and k reread from global memory.
        for (int ob = 0; ob < T::kBlocks; ++ob) {
          if (!span_over[ob]) continue;
          const int i = ob * T::kBlock + tid / T::kBlock, j = ob * T::kBlock + tid % T::kBlock;
          float sum = 0.0f;
          if (j <= i && i < lc) {
            const int64_t qo = (row_of(i) * p.heads + h) * dk, ko = (row_of(j) * p.heads + h) * dk;
            for (int a = 0; a < dk; ++a)
              sum += LoadElem(p.q.ptr, p.q.type, qo + a) * LoadElem(p.k.ptr, p.k.type, ko + a) *
                     __expf(bl[i * dk + a] - bl[j * dk + a]);
            sum *= qk_scale;
          }
          as[i * T::kLdA + j] = __float2bfloat16_rn(sum);
        }
        static_assert(T::kThreads == T::kBlock * T::kBlock, "exact block: one pair per thread");
      }
      __syncthreads();
    }

    // 5. o = (q̂ ⊙ e^{b_I0}) S, rows scaled (scalar) or columns (right), then
    //    += A·V (right: V̂ scaled per column, then every entry by e^{c_i − c_I0}).
    //    Warp w: rows 16(w/2).., the (w%2) half of the n-tiles. A norm's
    //    q'_iᵀ n_prev comes from the same q fragments: rows g and g + 8.
    //    A sequence's first chunk from a zero state (a segment's, in the
    //    segmented schedule) skips q̂ S and q'ᵀn: both are 0.
    if constexpr (kEmit) {
      const int mb = warp / 2, ntb = kOn * (warp % 2);
      float acc[kOn][4] = {};
      float qn[2] = {0.0f, 0.0f};
      const bool zero_state = kCarry && chunk == 0 && !p.s_init.ptr && !p.n_init;
#pragma unroll
      for (int k0 = 0; k0 < (zero_state ? 0 : dk); k0 += 16) {
        uint32_t fa[4];
        Ldsm4(fa, qs + (16 * mb + (lane & 15)) * ldq + k0 + 8 * (lane >> 4));
        if (norm) {
          const float* n = nn + k0 + 2 * t4;
          const float ns[4] = {n[0], n[1], n[8], n[9]};
          qn[0] += RowDot(fa, 0, ns);
          qn[1] += RowDot(fa, 1, ns);
        }
        if constexpr (kVector) {
          const float* f = eb0 + mb * dk + k0 + 2 * t4;
          const float fs[4] = {f[0], f[1], f[8], f[9]};
          ScaleCols(fa, fs);
        }
#pragma unroll
        for (int n = 0; n < kOn; n += 2) {
          uint32_t fb[4];
          Ldsm4T(fb, ss + (k0 + (lane & 15)) * ldv + 8 * (ntb + n) + 8 * (lane >> 4));
          Mma(acc[n], fa, fb[0], fb[1]);
          Mma(acc[n + 1], fa, fb[2], fb[3]);
        }
      }
      if (norm) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          qn[half] += __shfl_xor_sync(kAll, qn[half], 1);
          qn[half] += __shfl_xor_sync(kAll, qn[half], 2);
        }
      }
      if constexpr (kExtra) {
        // The extra feature's share of q'ᵀS: its q times S's extra row.
        const float q0 = extra_q[16 * mb + g], q8 = extra_q[16 * mb + g + 8];
#pragma unroll
        for (int n = 0; n < kOn; ++n) {
          const float2 row = *reinterpret_cast<const float2*>(extra_row + 8 * (ntb + n) + 2 * t4);
          acc[n][0] += q0 * row.x, acc[n][1] += q0 * row.y;
          acc[n][2] += q8 * row.x, acc[n][3] += q8 * row.y;
        }
      }
      if constexpr (kScalar) {
        const float r0 = p.q_scale * coef[16 * mb + g], r8 = p.q_scale * coef[16 * mb + g + 8];
#pragma unroll
        for (int n = 0; n < kOn; ++n) {
          acc[n][0] *= r0, acc[n][1] *= r0;
          acc[n][2] *= r8, acc[n][3] *= r8;
        }
      } else if constexpr (kRight) {
        const float* f = eb0 + mb * TV + 8 * ntb + 2 * t4;
#pragma unroll
        for (int n = 0; n < kOn; ++n) {
          const float f0 = p.q_scale * f[8 * n], f1 = p.q_scale * f[8 * n + 1];
          acc[n][0] *= f0, acc[n][1] *= f1;
          acc[n][2] *= f0, acc[n][3] *= f1;
        }
      }
      // Right: this block's first row of c, and the exact diagonal's flag.
      [[maybe_unused]] const float* c_first = bl + 16 * mb * gw;
      const bool exact_diagonal = kRight && span_over[mb];
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 16) {
        if (k0 > 16 * mb || (k0 == 16 * mb && exact_diagonal)) break;
        uint32_t fa[4];
        Ldsm4(fa, as + (16 * mb + (lane & 15)) * T::kLdA + k0 + 8 * (lane >> 4));
#pragma unroll
        for (int n = 0; n < kOn; n += 2) {
          uint32_t fb[4];
          Ldsm4T(fb, vs + (k0 + (lane & 15)) * ldv + 8 * (ntb + n) + 8 * (lane >> 4));
          if constexpr (kRight) {
            // V̂_J ⊙ e^{c_I0 − c_Je}: a fragment register holds one column (g).
            const float* c_last = bl + (k0 + T::kBlock - 1) * gw;
            const int col = 8 * (ntb + n) + g;
            ScaleTilePair(fb, __expf(c_first[col] - c_last[col]),
                          __expf(c_first[col + 8] - c_last[col + 8]));
          }
          Mma(acc[n], fa, fb[0], fb[1]);
          Mma(acc[n + 1], fa, fb[2], fb[3]);
        }
      }
      if constexpr (kRight) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * mb + g + 8 * half;
          const float* ci = bl + i * gw;
#pragma unroll
          for (int n = 0; n < kOn; ++n) {
            const int e = 8 * (ntb + n) + 2 * t4;
            acc[n][2 * half] *= __expf(ci[e] - c_first[e]);
            acc[n][2 * half + 1] *= __expf(ci[e + 1] - c_first[e + 1]);
          }
        }
        if (exact_diagonal) {
          // Σ_{j in I, j ≤ i} A_ij v_j e^{c_i − c_j} in fp32, raw v reread
          // from global memory.
          for (int half = 0; half < 2; ++half) {
            const int i = 16 * mb + g + 8 * half;
            for (int j = 16 * mb; j <= i && j < lc; ++j) {
              const float aij = __bfloat162float(as[i * T::kLdA + j]) * p.k_scale;
              const int64_t vo =
                  (row_of(j) * (p.heads / p.v_head_share) + h / p.v_head_share) * p.dv + e0;
              for (int n = 0; n < kOn; ++n) {
                const int e = 8 * (ntb + n) + 2 * t4;
                if (e >= tv) continue;
                for (int x = 0; x < 2; ++x)
                  acc[n][2 * half + x] += aij * LoadElem(p.v.ptr, p.v.type, vo + e + x) *
                                          __expf(bl[i * gw + e + x] - bl[j * gw + e + x]);
              }
            }
          }
        }
      }
      // 16-bit outputs leave in 16-byte pieces, staged in this row block's q
      // rows once both its warps are past their reads of them (named barrier
      // 1 + mb of the two warps); each warp then copies out what it staged.
      if (stage_out) asm volatile("bar.sync %0, 64;\n" ::"r"(1 + mb));
      bf16* staged = qs + 16 * mb * ldq;
      [[maybe_unused]] float row_dot[2] = {0.0f, 0.0f};  // ScanParams::row_dots
      [[maybe_unused]] const bf16* dot_tile =
          reinterpret_cast<const bf16*>(stage_base(st) + lay.w_off);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 16 * mb + g + 8 * half;
        if (i >= lc) continue;
        float inv_den = 1.0f;
        if constexpr (kScalar) {
          // q'ᵀn = e^{b_i + m_prev − m_i} q'_iᵀ n_prev + the in-chunk part.
          const float dot = norm ? den[i] + coef[i] * p.q_scale * qn[half] : 0.0f;
          if (p.norm == NormKind::kMlstmExp) {
            inv_den = 1.0f / (fmaxf(fabsf(dot), __expf(-ms[i])) + p.eps);
          } else if (p.norm == NormKind::kSigNorm) {
            inv_den = 1.0f / (fmaxf(fabsf(dot), 1.0f) + p.eps);
          }
          if (p.row_weight.ptr)
            inv_den *= __expf(GateAt(p.row_weight, bos, len, tok0 + dir * i, h, 0) + ms[i]);
          if (norm && p.norm_dot && tile == 0 && ntb == 0 && t4 == 0)
            p.norm_dot[row_of(i) * p.heads + h] = dot;
        }
        const int64_t out = (row_of(i) * p.heads + h) * p.dv + e0;
#pragma unroll
        for (int n = 0; n < kOn; ++n) {
          const int e = 8 * (ntb + n) + 2 * t4;
          if constexpr (kExtra) {
            if (p.row_dots) {
              const float2 d = __bfloat1622float2(
                  *reinterpret_cast<const __nv_bfloat162*>(dot_tile + i * ldv + e));
              row_dot[half] += (acc[n][2 * half] * d.x + acc[n][2 * half + 1] * d.y) * inv_den;
            }
          }
          if (stage_out) {
            StorePair(staged, p.o_type, (g + 8 * half) * ldq + e, acc[n][2 * half] * inv_den,
                      acc[n][2 * half + 1] * inv_den);
          } else if (e < tv) {
            StorePair(p.o, p.o_type, out + e, acc[n][2 * half] * inv_den,
                      acc[n][2 * half + 1] * inv_den);
          }
        }
      }
      if constexpr (kExtra) {
        if (p.row_dots) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float d = row_dot[half];
            d += __shfl_xor_sync(kAll, d, 1);
            d += __shfl_xor_sync(kAll, d, 2);
            const int i = 16 * mb + g + 8 * half;
            if (t4 == 0 && i < lc)
              atomicAdd(p.row_dots + seq * p.row_dots_seq_stride +
                            static_cast<int64_t>(tok0 + dir * i) * p.heads + h,
                        d);
          }
        }
      }
      if (stage_out) {
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kOn / 2; ++u) {
          const int idx = lane + 32 * u, r = idx / kOn, e = 8 * (ntb + idx % kOn);
          const int i = 16 * mb + r;
          if (i < lc && e < tv)
            *reinterpret_cast<uint4*>(static_cast<bf16*>(p.o) + (row_of(i) * p.heads + h) * p.dv +
                                      e0 + e) =
                *reinterpret_cast<const uint4*>(staged + r * ldq + e);
        }
      }
    }

    // 6. S ← decay ⊙ S + (k̂ ⊙ column or row weights)ᵀ V, in registers
    //    (right: S ⊙ e^{c_C} per column + Kᵀ (V̂ ⊙ e^{c_C − c_Je}) per column).
    if constexpr (kCarry) {
#pragma unroll
      for (int r = 0; r < kStateTiles; ++r) {
        const int a0 = 16 * (warp + 8 * r);
        if (a0 >= dk) continue;
        [[maybe_unused]] float nadd[2] = {0.0f, 0.0f};
        if constexpr (kRight) {
#pragma unroll
          for (int n = 0; n < kNt; ++n) {
            const float d0 = sdec[8 * n + 2 * t4], d1 = sdec[8 * n + 2 * t4 + 1];
            sacc[r][n][0] *= d0, sacc[r][n][1] *= d1;
            sacc[r][n][2] *= d0, sacc[r][n][3] *= d1;
          }
        } else {
          const float dg = kVector ? sdec[a0 + g] : coef[C - 1];
          const float dg8 = kVector ? sdec[a0 + g + 8] : coef[C - 1];
#pragma unroll
          for (int n = 0; n < kNt; ++n) {
            sacc[r][n][0] *= dg, sacc[r][n][1] *= dg;
            sacc[r][n][2] *= dg8, sacc[r][n][3] *= dg8;
          }
        }
#pragma unroll
        for (int jb = 0; jb < T::kBlocks; ++jb) {
          const int k0 = jb * T::kBlock;
          uint32_t fa[4];
          Ldsm4T(fa, ks + (k0 + (lane & 7) + 8 * (lane >> 4)) * ldq + a0 + 8 * ((lane >> 3) & 1));
          if constexpr (kVector) {
            ScaleRows(fa, ebl[jb * dk + a0 + g], ebl[jb * dk + a0 + g + 8]);
          } else if constexpr (kScalar) {
            const float* w = wj + k0 + 2 * t4;
            const float fs[4] = {w[0], w[1], w[8], w[9]};
            if (carry_n) {
              // n += Σ_j k_j w_j over this lane's columns j, before rounding.
              nadd[0] += RowDot(fa, 0, fs);
              nadd[1] += RowDot(fa, 1, fs);
            }
            ScaleCols(fa, fs);
          }
#pragma unroll
          for (int n = 0; n < kNt; n += 2) {
            uint32_t fb[4];
            Ldsm4T(fb, vs + (k0 + (lane & 15)) * ldv + 8 * n + 8 * (lane >> 4));
            if constexpr (kRight) {
              ScaleTilePair(fb, ebl[jb * TV + 8 * n + g], ebl[jb * TV + 8 * n + 8 + g]);
            }
            Mma(sacc[r][n], fa, fb[0], fb[1]);
            Mma(sacc[r][n + 1], fa, fb[2], fb[3]);
          }
        }
        if constexpr (kScalar) {
          if (carry_n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              nadd[half] += __shfl_xor_sync(kAll, nadd[half], 1);
              nadd[half] += __shfl_xor_sync(kAll, nadd[half], 2);
              nreg[r][half] = nreg[r][half] * coef[C - 1] + nadd[half];
            }
          }
        }
      }
      if constexpr (kExtra) {
        // S's extra row's parts: Σ_j (k'_j's extra feature · column weight) v_j
        // over a quarter of the rows j each (summed at the next chunk's start).
        static_assert(T::kThreads == kExtraParts * TV && C % kExtraParts == 0,
                      "a thread a column of a part");
        constexpr int kRows = C / kExtraParts;
        const int e = tid % TV, part = tid / TV;
        float sum = 0.0f;
#pragma unroll 8
        for (int j = part * kRows; j < (part + 1) * kRows; ++j)
          sum += extra_w[j] * __bfloat162float(vs[j * ldv + e]);
        extra_parts[part * TV + e] = sum;
      }
      if constexpr (kScalar) {
        if (p.stabilize) m_prev = ms[C - 1];
      }
    }
    __syncthreads();
  }

  // Final state tile back to its slot.
  if (kCarry && p.s_final.ptr) {
    const int slot = p.s_final.slot ? p.s_final.slot[seq] : seq;
    float* base = p.s_final.ptr + slot * p.s_final.slot_stride + head_off;
#pragma unroll
    for (int r = 0; r < kStateTiles; ++r)
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int a = 16 * (warp + 8 * r) + g + (c >= 2 ? 8 : 0), e = 8 * n + 2 * t4 + (c & 1);
          if (a < dk && e < tv)
            base[static_cast<int64_t>(a) * p.s_final.stride_a +
                 static_cast<int64_t>(e0 + e) * p.s_final.stride_b] = sacc[r][n][c];
        }
    if (blockIdx.x == 0) {
      if (p.n_final) {
#pragma unroll
        for (int r = 0; r < kStateTiles; ++r)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int a = n_row(r, half);
            if (t4 == 0 && a < dk)
              p.n_final[(static_cast<int64_t>(slot) * p.heads + h) * dk + a] = nreg[r][half];
          }
      }
      if (p.stabilize && p.m_final && tid == 0)
        p.m_final[static_cast<int64_t>(slot) * p.heads + h] = m_prev;
    }
  }
}

constexpr int kMaxSmemBytes = 227 * 1024;
constexpr int kSmPerSmBytes = 228 * 1024;  // per SM, 1 KB of it reserved per CTA
static_assert(MmaLayout(128, MmaDecay::kLeft, MmaPass::kFused).bytes <= kMaxSmemBytes,
              "left vector tile, dk 128, two stages");
static_assert(2 * (MmaLayout(128, MmaDecay::kScalar, MmaPass::kFused).bytes + 1024) <=
                  kSmPerSmBytes,
              "two scalar CTAs per SM");
static_assert(2 * (MmaLayout(128, MmaDecay::kLeft, MmaPass::kOutputs).bytes + 1024) <=
                  kSmPerSmBytes,
              "two left vector output CTAs per SM");
static_assert(2 * (MmaLayout(128, MmaDecay::kRight, MmaPass::kOutputs).bytes + 1024) <=
                  kSmPerSmBytes,
              "two right vector output CTAs per SM");
static_assert(2 * (MmaLayout(128, MmaDecay::kScalarExtra, MmaPass::kFused).bytes + 1024) <=
                  kSmPerSmBytes,
              "two scalar CTAs with the extra key feature per SM");
static_assert(2 * (MmaLayout(128, MmaDecay::kScalar, MmaPass::kStates).bytes + 1024) <=
                  kSmPerSmBytes,
              "two scalar state-pass CTAs per SM, two stages each");
static_assert(MmaLayout(MmaTile::kMaxDk, MmaDecay::kScalar, MmaPass::kFused).bytes <= kMaxSmemBytes,
              "scalar tile, dk 256");
static_assert(MmaLayout(MmaTile::kMaxDk, MmaDecay::kLeft, MmaPass::kFused).bytes <= kMaxSmemBytes,
              "left vector tile, dk 256");
static_assert(MmaLayout(MmaTile::kMaxDk, MmaDecay::kRight, MmaPass::kFused).bytes <= kMaxSmemBytes,
              "right vector tile, dk 256");

MmaDecay DecayOf(const ScanParams& p) {
  if (p.right.ptr) return MmaDecay::kRight;
  if (p.left_vector) return MmaDecay::kLeft;
  return p.extra_key ? MmaDecay::kScalarExtra : MmaDecay::kScalar;
}

template <MmaDecay kDecay, int kStateTiles, MmaPass kPass, int kDk>
cudaError_t LaunchMmaInstance(const ScanParams& p, bf16* chunk_states, int max_chunks,
                              cudaStream_t stream) {
  const int bytes = MmaLayout(p.dk, kDecay, kPass).bytes;
  auto* kernel = ScanMmaKernel<kDecay, kStateTiles, kPass, kDk>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  constexpr int kTileV = MmaTile::TileV(kStateTiles, kDecay, kPass);
  const int tiles = (p.dv + kTileV - 1) / kTileV;
  const dim3 grid(kPass == MmaPass::kOutputs ? tiles * max_chunks : tiles, p.heads, p.num_seqs);
  kernel<<<grid, MmaTile::kThreads, bytes, stream>>>(p, chunk_states);
  return cudaGetLastError();
}

// The key width of GLA's key blocks, simple GLA, mLSTM and the kernel
// benchmarks, compiled in (kDk): fwd at T = 4096 on an H200, simple GLA
// 1.023–1.044 → 0.909–0.935 ms, GLA 1.722–1.745 → 1.621–1.651, mLSTM exp
// 1.248–1.273 → 1.137–1.156.
constexpr int kCompiledDk = 128;

template <MmaDecay kDecay, MmaPass kPass>
cudaError_t LaunchDecay(const ScanParams& p, bf16* states, int max_chunks, cudaStream_t stream) {
  if (p.dk == kCompiledDk)
    return LaunchMmaInstance<kDecay, 1, kPass, kCompiledDk>(p, states, max_chunks, stream);
  return MmaTile::StateTiles(p.dk) == 1
             ? LaunchMmaInstance<kDecay, 1, kPass, 0>(p, states, max_chunks, stream)
             : LaunchMmaInstance<kDecay, 2, kPass, 0>(p, states, max_chunks, stream);
}

template <MmaPass kPass>
cudaError_t LaunchPass(const ScanParams& p, void* chunk_states, int max_chunks,
                       cudaStream_t stream) {
  bf16* states = static_cast<bf16*>(chunk_states);
  switch (DecayOf(p)) {
    case MmaDecay::kLeft:
      return LaunchDecay<MmaDecay::kLeft, kPass>(p, states, max_chunks, stream);
    case MmaDecay::kRight:
      return LaunchDecay<MmaDecay::kRight, kPass>(p, states, max_chunks, stream);
    case MmaDecay::kScalarExtra:  // one pass only (ScanMmaTwoPassSupports)
      if constexpr (kPass == MmaPass::kFused)
        return LaunchDecay<MmaDecay::kScalarExtra, kPass>(p, states, max_chunks, stream);
      return cudaErrorInvalidValue;
    default:
      return LaunchDecay<MmaDecay::kScalar, kPass>(p, states, max_chunks, stream);
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool Half(const Operand& op) {
  return (op.type == ElemType::kBF16 || op.type == ElemType::kF16) && Aligned16(op.ptr);
}

}  // namespace

bool ScanMmaSupports(const ScanParams& p) {
  // A right decay comes alone: no left decay, key weights or mLSTM fields.
  const bool right_alone =
      p.right.ptr == nullptr ||
      (p.left.ptr == nullptr && p.key_weight.ptr == nullptr && !p.stabilize &&
       p.norm == NormKind::kNone && p.n_init == nullptr && p.n_final == nullptr);
  // Row weights and the extra key feature go with scalar decays (the
  // feature without a norm).
  const bool scalar = !p.left_vector && !p.right.ptr;
  const bool scalar_fields_ok = (p.row_weight.ptr == nullptr && !p.extra_key) || scalar;
  if (p.extra_key && p.norm != NormKind::kNone) return false;
  if (p.row_dots && (!p.extra_key || !Half(p.dot_with))) return false;
  return Half(p.q) && Half(p.k) && Half(p.v) && right_alone && scalar_fields_ok && p.dk > 0 &&
         p.dk <= MmaTile::kMaxDk && p.dk % 16 == 0 && p.dv > 0 && p.dv % 16 == 0 &&
         MmaLayout(p.dk, DecayOf(p), MmaPass::kFused).bytes <= kMaxSmemBytes;
}

cudaError_t LaunchScanMma(const ScanParams& p, cudaStream_t stream) {
  if (ScanWgmmaSupports(p) && WgmmaAvailable()) return LaunchScanWgmma(p, stream);
  return LaunchPass<MmaPass::kFused>(p, nullptr, 0, stream);
}

bool ScanMmaTwoPassSupports(const ScanParams& p) {
  return ScanMmaSupports(p) && !p.reverse && !p.stabilize && p.norm == NormKind::kNone &&
         p.key_weight.ptr == nullptr && p.row_weight.ptr == nullptr && !p.extra_key &&
         p.n_init == nullptr && p.n_final == nullptr &&
         MmaLayout(p.dk, DecayOf(p), MmaPass::kOutputs).bytes <= kMaxSmemBytes;
}

int64_t ScanMmaChunkStates(int64_t tokens, int num_seqs) {
  return tokens / MmaTile::kChunk + num_seqs;
}

cudaError_t LaunchScanMmaStates(const ScanParams& p, void* chunk_states, cudaStream_t stream) {
  return LaunchPass<MmaPass::kStates>(p, chunk_states, 0, stream);
}

cudaError_t LaunchScanMmaOutputs(const ScanParams& p, const void* chunk_states, int max_len,
                                 cudaStream_t stream) {
  const int max_chunks = (max_len + MmaTile::kChunk - 1) / MmaTile::kChunk;
  if (max_chunks == 0) return cudaSuccess;
  // The kernel only reads the states; one signature serves all three passes.
  return LaunchPass<MmaPass::kOutputs>(p, const_cast<void*>(chunk_states), max_chunks, stream);
}

}  // namespace lair::kernels::cuda
