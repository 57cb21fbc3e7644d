// The segmented scan's own kernels (scan_segments.h): the segments' layout;
// every chunk's and segment's summed log decays; S_{g+1} = D_g ⊙ S_g + F_g
// walked per state entry; and the entry term ((q'_t ⊙ L_t)ᵀ S_g) ⊙ R_t added
// to the segments' local outputs.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma_fragments.cuh"
#include "kernels/cuda/scan_segments.h"

namespace lair::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kSumFeatures = 32;  // features per block of the decay sums (one per lane)
constexpr int kSumRows = 8;       // token lanes per feature
constexpr int kSumTokens = kSegmentChunk / kSumRows;  // tokens a lane sums
constexpr int kCarryThreads = 256;
constexpr int kCarryBatch = 8;  // segments (the carry) or chunks (the sums) loaded at once

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

// The features whose log decays a chunk sums: the left gate's (every key,
// or one value for a scalar decay), then the right gate's columns; none for
// an absent gate.
struct DecayFeatures {
  int left, right;
  __host__ __device__ explicit DecayFeatures(const SegmentParams& p)
      : left(p.left.ptr ? (p.left_vector ? p.dk : 1) : 0), right(p.right.ptr ? p.dv : 0) {}
  __host__ __device__ int width() const { return left + right; }
};

// A gate's log value at packed token `token` (GateAt without the shift the
// segments exclude and without its branches): one load the compiler may
// issue beside others.
__device__ __forceinline__ float GateLog(const LogGate& g, int64_t token, int h, int feature) {
  const float x = g.ptr[token * g.token_stride + static_cast<int64_t>(h) * g.head_stride + feature];
  return g.fn == GateFn::kLogSigmoid ? LogSigmoid(x) : x;
}

// The decay sums of chunk c of segment g, head h: [features]; after
// SegmentDecaySumsKernel, those of the segment's chunks before c.
__device__ __forceinline__ float* ChunkSums(const SegmentParams& p, int g, int c, int h) {
  const int chunks = p.span / kSegmentChunk;
  return p.decay_sums +
         ((static_cast<int64_t>(g) * chunks + c) * p.heads + h) * DecayFeatures(p).width();
}
// The decay sums of segment g, head h, after every chunk's: [features].
__device__ __forceinline__ float* SegmentSums(const SegmentParams& p, int g, int h) {
  const int64_t chunk_floats = static_cast<int64_t>(p.segments) * (p.span / kSegmentChunk) *
                               p.heads * DecayFeatures(p).width();
  return p.decay_sums + chunk_floats +
         (static_cast<int64_t>(g) * p.heads + h) * DecayFeatures(p).width();
}

// decay_sums[g, c, h, f] = Σ_{t ∈ chunk c of g} of feature f's log decay
// (DecayFeatures; 0 for a chunk past the segment's end), until
// SegmentDecaySumsKernel turns them into the sums before each chunk; grid
// (features / 32, H, segments · chunks per segment).
__global__ void ChunkDecaySumsKernel(const SegmentParams p) {
  __shared__ float part[kSumRows][kSumFeatures + 1];
  const DecayFeatures features(p);
  const int chunks = p.span / kSegmentChunk;
  const int f = blockIdx.x * kSumFeatures + threadIdx.x, h = blockIdx.y;
  const int g = blockIdx.z / chunks, c = blockIdx.z % chunks;
  const int64_t bos = p.segment_cu[g];
  const int len = p.segment_cu[g + 1] - static_cast<int>(bos);
  const int end = min((c + 1) * kSegmentChunk, len);
  float sum = 0.0f;
  if (f < features.width() && end > c * kSegmentChunk) {
    const bool left = f < features.left;
    const LogGate& gate = left ? p.left : p.right;
    const int feature = left ? f : f - features.left;
    // Every load issued at once: tokens past the end read the last one.
    float x[kSumTokens];
#pragma unroll
    for (int j = 0; j < kSumTokens; ++j) {
      const int t = c * kSegmentChunk + threadIdx.y + kSumRows * j;
      x[j] = GateLog(gate, bos + min(t, end - 1), h, feature);
    }
#pragma unroll
    for (int j = 0; j < kSumTokens; ++j)
      if (c * kSegmentChunk + threadIdx.y + kSumRows * j < end) sum += x[j];
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || f >= features.width()) return;
  for (int r = 1; r < kSumRows; ++r) sum += part[r][threadIdx.x];
  ChunkSums(p, g, c, h)[f] = sum;
}

// SegmentSums = Σ of the segment's ChunkSums, a thread per (segment, head,
// feature), summed in chunk order; each ChunkSums entry becomes the sum of
// the chunks before it (what the entry term starts a chunk's decays from).
__global__ void SegmentDecaySumsKernel(const SegmentParams p) {
  const int width = DecayFeatures(p).width();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kCarryThreads) + threadIdx.x;
  if (i >= static_cast<int64_t>(p.segments) * p.heads * width) return;
  const int f = i % width, h = (i / width) % p.heads,
            g = i / (static_cast<int64_t>(width) * p.heads);
  const int chunks = p.span / kSegmentChunk;
  float sum = 0.0f;
  for (int c0 = 0; c0 < chunks; c0 += kCarryBatch) {
    float own[kCarryBatch];  // every load of a batch issued before its stores
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j) own[j] = ChunkSums(p, g, min(c0 + j, chunks - 1), h)[f];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j) {
      if (c0 + j >= chunks) break;
      ChunkSums(p, g, c0 + j, h)[f] = sum;
      sum += own[j];
    }
  }
  SegmentSums(p, g, h)[f] = sum;
}

// One thread per state entry (h, a, e) of sequence blockIdx.y, in order over
// its segments, kCarryBatch at a time: their loads go out before the batch's
// stores, so that the walk waits on memory once a batch rather than once a
// segment.
__global__ void CarryKernel(const SegmentParams p) {
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
  const int first = p.seq_segments[s], last = p.seq_segments[s + 1];
  for (int g0 = first; g0 < last; g0 += kCarryBatch) {
    float local[kCarryBatch], log_decay[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j) {
      const int g = min(g0 + j, last - 1);
      local[j] = p.local_final[g * per_seq + i];
      const float* sums = SegmentSums(p, g, h);
      log_decay[j] = (features.left ? sums[left_feature] : 0.0f) +
                     (features.right ? sums[features.left + e] : 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j) {
      if (g0 + j >= last) break;
      const int64_t off = (g0 + j) * per_seq + i;
      if (p.entering_type == ElemType::kBF16) {
        static_cast<bf16*>(p.entering)[off] = __float2bfloat16_rn(state);
      } else {
        static_cast<float*>(p.entering)[off] = state;
      }
      state = expf(log_decay[j]) * state + local[j];
    }
  }
  if (p.s_final.ptr) p.s_final.ptr[at(p.s_final)] = state;
}

// The entry term: one CTA of 8 warps per (chunk of 64 tokens, head, segment)
// forms Q̃ = q' ⊙ L in shared memory (bf16, keys padded to a multiple of 16
// with zeros), then walks the dv tiles of 64 columns, each a product over
// pieces of S_g of up to 256 keys (a whole tile at GLA's and GSA's widths),
// copied in by cp.async one piece ahead. Warp w holds rows 16(w mod 4).. and
// columns 32⌊w / 4⌋.. of a tile. The epilogue stages the tile in fp32 in the
// piece's buffer, now read, and then every thread takes 4 consecutive
// columns of a row at a time: it scales by R, adds the key blocks' local
// outputs (loaded before the piece's wait, so that their latency overlaps
// it) and stores o, each warp reading and writing whole rows.
constexpr int kEntryWarps = 8;
constexpr int kEntryThreads = 32 * kEntryWarps;
constexpr int kEntryCols = 64;   // dv columns per tile
constexpr int kEntryKeys = 256;  // most rows of S per piece
// A vector decay's Q̃: a thread takes 8 keys of kGroupRows rows, and the
// kRowGroups threads of the chunk's rows of those keys are consecutive lanes
// (a whole warp). Four rows a thread spilled at 128 registers.
constexpr int kGroupRows = 2;
constexpr int kRowGroups = kSegmentChunk / kGroupRows;
constexpr int kOutVec = 4;  // consecutive outputs a thread stores at a time
constexpr int kOutSteps = kSegmentChunk * kEntryCols / (kEntryThreads * kOutVec);
constexpr int kEarlyCopies = 2;  // local-output parts loaded ahead of the product
static_assert(kRowGroups <= 32 && 32 % kRowGroups == 0, "a key octet's row groups share a warp");
// Two CTAs per multiprocessor where 128 registers a thread hold the kernel
// without spilling (sm_90; sm_80's code needs more).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kEntryMinBlocks = 1;
#else
constexpr int kEntryMinBlocks = 2;
#endif
// bf16 rows padded by 8: a row stride ≡ 4 words (mod 8) puts the eight rows
// of an ldmatrix phase in distinct banks.
constexpr int kEntryPad = 8;
constexpr int kLdPiece = kEntryCols + kEntryPad;
constexpr int kLdRight = kEntryCols + 1;
// The fp32 staging of a tile: a row stride ≡ 8 words (mod 32) puts the four
// rows of a half warp's accumulator pairs in distinct banks.
constexpr int kLdStage = kEntryCols + 8;

// Byte offsets of the entry kernel's dynamic shared memory (16-byte
// aligned): Q̃, bf16 [C][ldq], at 0; two piece buffers, each an S piece,
// bf16 [piece_keys][kLdPiece], or a staged tile, fp32 [C][kLdStage];
// q_scale · L_t per row, fp32 [C]; and for a right decay R_t of a tile, fp32
// [C][kLdRight].
struct EntryLayout {
  int keys = 0, ldq = 0, piece_keys = 0;  // keys padded to 16; Q̃'s row stride; a piece's rows
  int pieces = 0, piece_bytes = 0, row_factors = 0, right_factors = 0, bytes = 0;
  __host__ __device__ EntryLayout(int dk, bool right) {
    constexpr int C = kSegmentChunk;
    keys = (dk + 15) / 16 * 16;
    ldq = keys + kEntryPad;
    piece_keys = keys < kEntryKeys ? keys : kEntryKeys;
    pieces = C * ldq * 2;
    piece_bytes = piece_keys * kLdPiece * 2;
    if (piece_bytes < C * kLdStage * 4) piece_bytes = C * kLdStage * 4;
    row_factors = pieces + 2 * piece_bytes;
    right_factors = row_factors + C * 4;
    bytes = right_factors + (right ? C * kLdRight * 4 : 0);
  }
};

// x's eight bf16 values times f, rounded to bf16.
__device__ __forceinline__ uint4 Scale8(uint4 x, float f) {
  return make_uint4(Scale2(x.x, f, f), Scale2(x.y, f, f), Scale2(x.z, f, f), Scale2(x.w, f, f));
}

// The eight 16-bit values of x (t bf16, else f16) in fp32.
__device__ __forceinline__ void Widen8Bits(uint4 x, ElemType t, float (&out)[8]) {
  const float4 lo = SixteenBitQuad(make_uint2(x.x, x.y), t);
  const float4 hi = SixteenBitQuad(make_uint2(x.z, x.w), t);
  out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
  out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
}

// Features a..a + 7 of a gate at packed token `token` (GateLog's, eight at
// once): two 16-byte loads where the gate's rows allow them.
__device__ __forceinline__ void GateLogs8(const LogGate& g, bool vector_loads, int64_t token, int h,
                                          int a, float (&out)[8]) {
  const float* x = g.ptr + token * g.token_stride + static_cast<int64_t>(h) * g.head_stride + a;
  if (vector_loads) {
    const float4 lo = *reinterpret_cast<const float4*>(x);
    const float4 hi = *reinterpret_cast<const float4*>(x + 4);
    out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
    out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = x[k];
  }
  if (g.fn == GateFn::kLogSigmoid) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = LogSigmoid(out[k]);
  }
}

// kOutVec parts of o^loc as raw bits (fp32: a uint4; 16-bit: .x and .y), so
// that the load's wait comes where PartsAdd reads them.
__device__ __forceinline__ uint4 PartBits(const SegmentParams& p, int64_t off) {
  if (p.local_type == ElemType::kF32)
    return *reinterpret_cast<const uint4*>(static_cast<const float*>(p.local_out) + off);
  const uint2 bits =
      *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.local_out) + off);
  return make_uint4(bits.x, bits.y, 0u, 0u);
}
__device__ __forceinline__ void PartsAdd(ElemType type, uint4 bits, float (&x)[kOutVec]) {
  const float4 v = type == ElemType::kF32
                       ? make_float4(__uint_as_float(bits.x), __uint_as_float(bits.y),
                                     __uint_as_float(bits.z), __uint_as_float(bits.w))
                       : SixteenBitQuad(make_uint2(bits.x, bits.y), type);
  x[0] += v.x, x[1] += v.y, x[2] += v.z, x[3] += v.w;
}

__global__ void __launch_bounds__(kEntryThreads, kEntryMinBlocks)
    SegmentEntryKernel(const SegmentParams p) {
  constexpr int C = kSegmentChunk;
  extern __shared__ __align__(16) unsigned char smem[];
  const bool right = p.right.ptr != nullptr;
  const EntryLayout lay(p.dk, right);
  bf16* qt = reinterpret_cast<bf16*>(smem);
  float* row_factor = reinterpret_cast<float*>(smem + lay.row_factors);
  float* right_factor = reinterpret_cast<float*>(smem + lay.right_factors);

  const int c = blockIdx.x, h = blockIdx.y, g = blockIdx.z;
  const int64_t bos = p.segment_cu[g];
  const int len = p.segment_cu[g + 1] - static_cast<int>(bos);
  const int t0 = c * C, lc = min(C, len - t0);
  if (lc <= 0) return;
  const int64_t tok0 = bos + t0;  // packed token of the chunk's row 0
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int dk = p.dk, dv = p.dv, ldq = lay.ldq;
  const DecayFeatures features(p);
  // Feature f's log decays summed over the segment's chunks before this one
  // (SegmentDecaySumsKernel).
  const float* before_chunk = ChunkSums(p, g, c, h);
  auto q_at = [&](int i, int a) { return ((tok0 + i) * p.heads + h) * dk + a; };

  // S_g's pieces: piece n is keys piece_keys·(n mod key_pieces).. of tile
  // ⌊n / key_pieces⌋, in buffer n mod 2.
  const int key_pieces = (lay.keys + lay.piece_keys - 1) / lay.piece_keys;
  const int num_pieces = key_pieces * ((dv + kEntryCols - 1) / kEntryCols);
  const bf16* state =
      static_cast<const bf16*>(p.entering) + (static_cast<int64_t>(g) * p.heads + h) * dk * dv;
  auto buffer = [&](int n) { return smem + lay.pieces + (n & 1) * lay.piece_bytes; };
  auto issue = [&](int n) {
    const int a0 = lay.piece_keys * (n % key_pieces), e0 = kEntryCols * (n / key_pieces);
    bf16* dst = reinterpret_cast<bf16*>(buffer(n));
    for (int idx = tid; idx < lay.piece_keys * (kEntryCols / 8); idx += kEntryThreads) {
      const int r = idx / (kEntryCols / 8), col = 8 * (idx % (kEntryCols / 8));
      const bool live = a0 + r < dk && e0 + col < dv;
      CpAsync16(dst + r * kLdPiece + col,
                state + (live ? static_cast<int64_t>(a0 + r) * dv + e0 + col : 0), live);
    }
    CpAsyncCommit();
  };
  issue(0);

  // 1. Q̃ = q' ⊙ L, while the first piece is in flight. A vector decay: work
  //    item w takes keys 8⌊w / kRowGroups⌋.. of the kGroupRows rows of group
  //    w mod kRowGroups (rows past the chunk read its last one, and count
  //    zero); the groups of an octet, consecutive lanes, scan their sums to
  //    learn where each starts. Otherwise warp 0 scans the rows' decays and
  //    every row is q scaled by one factor.
  if (p.left.ptr && p.left_vector) {
    const bool vector_loads = reinterpret_cast<uintptr_t>(p.left.ptr) % 16 == 0 &&
                              p.left.token_stride % 4 == 0 && p.left.head_stride % 4 == 0;
    const int items = (lay.keys / 8 * kRowGroups + 31) / 32 * 32;  // whole warps: the shuffles
    for (int w = tid; w < items; w += kEntryThreads) {
      const int a = 8 * (w / kRowGroups), group = w % kRowGroups, i0 = kGroupRows * group;
      const bool key = a < dk;  // dk % 16 == 0: an octet is all keys or all padding
      float gate[kGroupRows][8];
      uint4 q_bits[kGroupRows];
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        const int i = min(i0 + r, lc - 1);
        if (key) {
          GateLogs8(p.left, vector_loads, tok0 + i, h, a, gate[r]);
          q_bits[r] =
              *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q.ptr) + q_at(i, a));
        }
      }
      float start[8];  // the group's sums, then the chunk's log decay before its rows
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < kGroupRows; ++r) {
          if (!key || i0 + r >= lc) gate[r][k] = 0.0f;
          sum += gate[r][k];
        }
        // Inclusive scan over the octet's groups, then shifted by one lane.
#pragma unroll
        for (int d = 1; d < kRowGroups; d *= 2) {
          const float up = __shfl_up_sync(0xffffffffu, sum, d, kRowGroups);
          if (group >= d) sum += up;
        }
        const float before = __shfl_up_sync(0xffffffffu, sum, 1, kRowGroups);
        start[k] = (key ? before_chunk[a + k] : 0.0f) + (group > 0 ? before : 0.0f);
      }
      if (!key) continue;
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        float q[8];
        Widen8Bits(q_bits[r], p.q.type, q);
        __nv_bfloat162 out[4];
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
          start[k] += gate[r][k], start[k + 1] += gate[r][k + 1];
          const bool live = i0 + r < lc;
          out[k / 2] =
              __floats2bfloat162_rn(live ? p.q_scale * q[k] * __expf(start[k]) : 0.0f,
                                    live ? p.q_scale * q[k + 1] * __expf(start[k + 1]) : 0.0f);
        }
        uint4 packed;
        memcpy(&packed, out, 16);
        *reinterpret_cast<uint4*>(qt + (i0 + r) * ldq + a) = packed;
      }
    }
  } else {
    if (warp == 0) {
      // Lane l takes rows 2l and 2l + 1; an inclusive scan of their pairs.
      const int i = 2 * lane;
      const float l0 = p.left.ptr && i < lc ? GateLog(p.left, tok0 + i, h, 0) : 0.0f;
      const float l1 = p.left.ptr && i + 1 < lc ? GateLog(p.left, tok0 + i + 1, h, 0) : 0.0f;
      float pair_sum = l0 + l1;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, pair_sum, d);
        if (lane >= d) pair_sum += up;
      }
      const float base = pair_sum - l0 - l1 + (p.left.ptr ? before_chunk[0] : 0.0f);
      row_factor[i] = p.q_scale * __expf(base + l0);
      row_factor[i + 1] = p.q_scale * __expf(base + l0 + l1);
    }
    __syncthreads();
    for (GridWalk w(tid, lay.keys / 8, kEntryThreads); w.row < C; w.Next()) {
      const int i = w.row, a = 8 * w.col;
      const bool live = i < lc && a < dk;
      *reinterpret_cast<uint4*>(qt + i * ldq + a) =
          live ? Scale8(Load8(p.q, q_at(i, a)), row_factor[i]) : make_uint4(0, 0, 0, 0);
    }
  }

  // 2. The tiles, a piece at a time.
  const int mb = warp % 4, ntb = 4 * (warp / 4), gr = lane / 4, t4 = lane % 4;
  const int copies = p.copies;
  float acc[4][4];
  // The epilogue's outputs of this thread: step s is row out_row(s), columns
  // out_col.. + kOutVec − 1 of the tile (a warp's steps whole rows).
  auto out_row = [&](int step) { return (step * kEntryThreads + tid) / (kEntryCols / kOutVec); };
  const int out_col = kOutVec * (tid % (kEntryCols / kOutVec));
  uint4 early[kOutSteps][kEarlyCopies];  // the tile's first local-output parts (PartBits)
  for (int n = 0; n < num_pieces; ++n) {
    const int kp = n % key_pieces, e0 = kEntryCols * (n / key_pieces);
    const bool last_piece = kp == key_pieces - 1;
    // Columns past dv (dv % 16 == 0, so a thread's four are all in or out).
    const bool col_live = e0 + out_col < dv;
    if (last_piece) {
#pragma unroll
      for (int step = 0; step < kOutSteps; ++step) {
        const int i = min(out_row(step), lc - 1);
        const int e = col_live ? e0 + out_col : 0;
#pragma unroll
        for (int copy = 0; copy < kEarlyCopies; ++copy) {
          early[step][copy] =
              copy < copies ? PartBits(p, (((tok0 + i) * p.heads + h) * copies + copy) * dv + e)
                            : make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    CpAsyncWait<0>();
    __syncthreads();  // piece n landed, Q̃ written, buffer n − 1 and R read by every warp
    if (n + 1 < num_pieces) issue(n + 1);
    if (right && kp == 0) {
      // R_t of this tile's columns: every thread copies in gate entries, then
      // a thread per column walks it down the chunk.
#pragma unroll 8
      for (int idx = tid; idx < C * kEntryCols; idx += kEntryThreads) {
        const int i = idx / kEntryCols, e = idx % kEntryCols;
        const float x = GateLog(p.right, tok0 + min(i, lc - 1), h, min(e0 + e, dv - 1));
        right_factor[i * kLdRight + e] = i < lc && e0 + e < dv ? x : 0.0f;
      }
      __syncthreads();
      for (int e = tid; e < kEntryCols; e += kEntryThreads) {
        float cum = e0 + e < dv ? before_chunk[features.left + e0 + e] : 0.0f;
        for (int i = 0; i < C; ++i) {
          cum += right_factor[i * kLdRight + e];
          right_factor[i * kLdRight + e] = __expf(cum);
        }
      }
      __syncthreads();
    }
    if (kp == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    }
    const bf16* piece = reinterpret_cast<const bf16*>(buffer(n));
    const int a0 = lay.piece_keys * kp, rows = min(lay.piece_keys, lay.keys - a0);
#pragma unroll 4
    for (int k0 = 0; k0 < rows; k0 += 16) {
      uint32_t fa[4];
      Ldsm4(fa, qt + (16 * mb + (lane & 15)) * ldq + a0 + k0 + 8 * (lane >> 4));
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        uint32_t fb[4];
        Ldsm4T(fb, piece + (k0 + (lane & 15)) * kLdPiece + 8 * (ntb + j) + 8 * (lane >> 4));
        Mma(acc[j], fa, fb[0], fb[1]);
        Mma(acc[j + 1], fa, fb[2], fb[3]);
      }
    }
    if (!last_piece) continue;
    // The tile through buffer n, which every warp has read: acc[j] holds rows
    // 16·mb + gr (+ 8), columns 8·(ntb + j) + 2·t4 (+ 1).
    float* stage = reinterpret_cast<float*>(buffer(n));
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<float2*>(stage + (16 * mb + gr + 8 * half) * kLdStage + 8 * (ntb + j) +
                                   2 * t4) = make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
      }
    __syncthreads();
#pragma unroll
    for (int step = 0; step < kOutSteps; ++step) {
      const int i = out_row(step);
      if (i >= lc || !col_live) continue;
      const float4 staged = *reinterpret_cast<const float4*>(stage + i * kLdStage + out_col);
      float x[kOutVec] = {staged.x, staged.y, staged.z, staged.w};
      if (right) {
#pragma unroll
        for (int v = 0; v < kOutVec; ++v) x[v] *= right_factor[i * kLdRight + out_col + v];
      }
      const int64_t row = (tok0 + i) * p.heads + h;
#pragma unroll
      for (int copy = 0; copy < kEarlyCopies; ++copy) PartsAdd(p.local_type, early[step][copy], x);
      for (int copy = kEarlyCopies; copy < copies; ++copy)
        PartsAdd(p.local_type, PartBits(p, (row * copies + copy) * dv + e0 + out_col), x);
      const int64_t out = row * dv + e0 + out_col;
      StorePair(p.o, p.o_type, out, x[0], x[1]);
      StorePair(p.o, p.o_type, out + 2, x[2], x[3]);
    }
  }
}

constexpr int kMaxEntrySmemBytes = 227 * 1024;

}  // namespace

cudaError_t LaunchSegmentOffsets(const int32_t* cu_seqlens, int num_seqs, int span,
                                 int32_t* segment_cu, int32_t* seq_segments, cudaStream_t stream) {
  if (span <= 0) return cudaErrorInvalidValue;
  SegmentOffsetsKernel<<<1, 1, 0, stream>>>(cu_seqlens, num_seqs, span, segment_cu, seq_segments);
  return cudaGetLastError();
}

cudaError_t LaunchCarrySegmentStates(const SegmentParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  if (p.left.shift || p.right.shift || p.span % kSegmentChunk != 0)
    return cudaErrorInvalidValue;  // segments would cut the shifted gates
  if (const int width = DecayFeatures(p).width(); p.segments > 0 && width > 0) {
    const dim3 grid((width + kSumFeatures - 1) / kSumFeatures, p.heads,
                    p.segments * (p.span / kSegmentChunk));
    ChunkDecaySumsKernel<<<grid, dim3(kSumFeatures, kSumRows), 0, stream>>>(p);
    const int64_t totals = static_cast<int64_t>(p.segments) * p.heads * width;
    SegmentDecaySumsKernel<<<static_cast<unsigned>((totals + kCarryThreads - 1) / kCarryThreads),
                             kCarryThreads, 0, stream>>>(p);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  const int64_t per_seq = static_cast<int64_t>(p.heads) * p.dk * p.dv;
  const dim3 grid(static_cast<unsigned>((per_seq + kCarryThreads - 1) / kCarryThreads), p.num_seqs);
  CarryKernel<<<grid, kCarryThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

bool SegmentEntriesSupported(const SegmentParams& p) {
  const bool sixteen_bit = (p.q.type == ElemType::kBF16 || p.q.type == ElemType::kF16) &&
                           reinterpret_cast<uintptr_t>(p.q.ptr) % 16 == 0;
  return sixteen_bit && p.entering_type == ElemType::kBF16 && p.dk > 0 && p.dk % 16 == 0 &&
         p.dv > 0 && p.dv % 16 == 0 && (p.left.ptr == nullptr || p.right.ptr == nullptr) &&
         !p.left.shift && !p.right.shift && p.span % kSegmentChunk == 0 && p.copies > 0 &&
         EntryLayout(p.dk, p.right.ptr != nullptr).bytes <= kMaxEntrySmemBytes;
}

cudaError_t LaunchAddSegmentEntries(const SegmentParams& p, cudaStream_t stream) {
  if (p.segments == 0) return cudaSuccess;
  if (!SegmentEntriesSupported(p)) return cudaErrorInvalidValue;
  const int bytes = EntryLayout(p.dk, p.right.ptr != nullptr).bytes;
  if (const cudaError_t err = cudaFuncSetAttribute(
          SegmentEntryKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      err != cudaSuccess)
    return err;
  const dim3 grid(p.span / kSegmentChunk, p.heads, p.segments);
  SegmentEntryKernel<<<grid, kEntryThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
