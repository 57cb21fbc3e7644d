// The scalar-decay scan on warpgroup products (scan_wgmma.h): one CTA of one
// warpgroup (four warps) per (sequence, head, 64-column dv tile), sequential
// over chunks of C = 64 tokens. Every product is an m64n64k16 wgmma with fp32
// accumulators; S [128 keys × 64] lives in fp32 registers (two m64
// accumulators) and, rounded once per chunk to bf16, in shared memory as the
// B operand of Q S (as the mma.sync scan and fla round it). Operand tiles use
// the 128-byte swizzle (wgmma.cuh). Per chunk, with b
// the inclusive in-chunk cumsum of the log decay:
//   A  = (Q Kᵀ) ⊙ qk_scale·e^{b_i − b_j}, masked j ≤ i        (to bf16 registers)
//   O  = diag(q_scale·e^{b_i}) (Q S) + A V                    (A from registers)
//   S ← e^{b_C} S + Kᵀ V̂,   V̂_j = k_scale·e^{b_C − b_j} v_j    (V̂ rounded to bf16)
// Every factor is at most 1 (b falls), so no stabilizer is needed. The copies
// of chunk c + 1 (cp.async, two stages) fly while chunk c computes; V̂ and
// A's factors are formed while Q Kᵀ and Q S run on the tensor cores, and A's
// fragments while the state update runs. Three barriers a chunk.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma_fragments.cuh"
#include "kernels/cuda/scan_wgmma.h"
#include "kernels/cuda/wgmma.cuh"

namespace lair::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kChunk = 64;     // C, the m64 of every product
constexpr int kKeys = 128;     // dk
constexpr int kTileV = 64;     // dv columns per CTA, the n64 of every product
constexpr int kThreads = 128;  // one warpgroup
constexpr int kStages = 2;

// Byte offsets of the dynamic shared memory from its first 1024-byte boundary
// (tiles swizzled, wgmma.cuh).
struct Layout {
  static constexpr int kQ = 0;                            // q [C][dk]
  static constexpr int kK = kQ + kChunk * kKeys * 2;      // k [C][dk]
  static constexpr int kV = kK + kChunk * kKeys * 2;      // v tile [C][TV]
  static constexpr int kGate = kV + kChunk * kTileV * 2;  // raw log decays, fp32 [C]
  static constexpr int kStageBytes =
      (kGate + kChunk * 4 + wgmma::kAtomBytes - 1) / wgmma::kAtomBytes * wgmma::kAtomBytes;
  static constexpr int kVhat = kStages * kStageBytes;                         // V̂ [C][TV]
  static constexpr int kS = kVhat + kChunk * kTileV * 2;                      // S in bf16 [dk][TV]
  static constexpr int kBytes = kS + kKeys * kTileV * 2 + wgmma::kAtomBytes;  // + alignment
};
static_assert(2 * (Layout::kBytes + 1024) <= 228 * 1024, "two CTAs per SM");

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

__global__ void __launch_bounds__(kThreads, 2) ScanWgmmaKernel(const ScanParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int C = kChunk;
  constexpr unsigned kAll = 0xffffffffu;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem =
      smem_raw + (wgmma::kAtomBytes - SmemAddr(smem_raw) % wgmma::kAtomBytes) % wgmma::kAtomBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int h = blockIdx.y, seq = blockIdx.z, e0 = blockIdx.x * kTileV;
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const int num_chunks = (len + C - 1) / C;
  const int v_heads = p.heads / p.v_head_share, vh = h / p.v_head_share;
  const int64_t head_off = static_cast<int64_t>(h) * kKeys * p.dv;
  const float qk_scale = p.q_scale * p.k_scale;
  // 16-bit outputs leave through shared memory in 16-byte pieces.
  const bool stage_out = (p.o_type == ElemType::kBF16 || p.o_type == ElemType::kF16) &&
                         reinterpret_cast<uintptr_t>(p.o) % 16 == 0;

  // 1. The copies of chunk `chunk` into stage st, one cp.async group; rows
  //    past the sequence are zero. q and k: thread t takes column piece t % 16
  //    of rows t / 16 + 8i (a warp reads two whole rows); v: piece t % 8 of
  //    rows t / 8 + 16i. The swizzle keeps each warp's writes in distinct banks.
  const int qk_row = tid / 16, qk_col = 8 * (tid % 16), v_row = tid / 8, v_col = 8 * (tid % 8);
  auto issue = [&](int chunk, int st) {
    unsigned char* base = smem + st * Layout::kStageBytes;
    const int c0 = chunk * C, lc = min(C, len - c0);
    const auto* q = static_cast<const bf16*>(p.q.ptr) + ((bos + c0) * p.heads + h) * kKeys + qk_col;
    const auto* k = static_cast<const bf16*>(p.k.ptr) + ((bos + c0) * p.heads + h) * kKeys + qk_col;
    const int qk_at = wgmma::Swizzled(C, qk_row, qk_col);
#pragma unroll
    for (int i = 0; i < C / 8; ++i) {
      const int r = qk_row + 8 * i;
      const bool live = r < lc;
      const int64_t off = live ? static_cast<int64_t>(r) * p.heads * kKeys : 0;
      CpAsync16(base + Layout::kQ + qk_at + 8 * 128 * i, q + off, live);
      CpAsync16(base + Layout::kK + qk_at + 8 * 128 * i, k + off, live);
    }
    const auto* v =
        static_cast<const bf16*>(p.v.ptr) + ((bos + c0) * v_heads + vh) * p.dv + e0 + v_col;
    const int v_at = wgmma::Swizzled(C, v_row, v_col);
#pragma unroll
    for (int i = 0; i < C / 16; ++i) {
      const int r = v_row + 16 * i;
      const bool live = r < lc;
      CpAsync16(base + Layout::kV + v_at + 16 * 128 * i,
                v + (live ? static_cast<int64_t>(r) * v_heads * p.dv : 0), live);
    }
    if (tid < C) {
      const bool live = tid < lc && p.left.ptr != nullptr;
      const float* src = live ? p.left.ptr + (bos + c0 + tid) * p.left.token_stride +
                                    static_cast<int64_t>(h) * p.left.head_stride
                              : static_cast<const float*>(p.q.ptr);  // mapped; not read
      CpAsync4(base + Layout::kGate + 4 * tid, src, live);
    }
    CpAsyncCommit();
  };

  // S: sacc[r] holds keys 64r.. as an m64n64 accumulator (wgmma.cuh).
  float sacc[2][32];
  const auto s_row = [&](int r, int i) { return 64 * r + 16 * warp + g + 8 * (i / 2 % 2); };
  const auto s_col = [&](int i) { return 8 * (i / 4) + 2 * t4 + i % 2; };
  {
    const int slot = p.s_init.slot ? p.s_init.slot[seq] : seq;
    const float* base =
        p.s_init.ptr ? p.s_init.ptr + slot * p.s_init.slot_stride + head_off : nullptr;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i)
        sacc[r][i] = base ? base[static_cast<int64_t>(s_row(r, i)) * p.s_init.stride_a +
                                 static_cast<int64_t>(e0 + s_col(i)) * p.s_init.stride_b]
                          : 0.0f;
  }

  if (num_chunks > 0) issue(0, 0);
  for (int chunk = 0; chunk < num_chunks; ++chunk) {
    const int st = chunk % kStages;
    const int c0 = chunk * C, lc = min(C, len - c0);
    unsigned char* base = smem + st * Layout::kStageBytes;
    CpAsyncWait<0>();
    // S entering the chunk, rounded to bf16: the B operand of Q S.
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; i += 2)
        *reinterpret_cast<uint32_t*>(smem + Layout::kS +
                                     wgmma::Swizzled(kKeys, s_row(r, i), s_col(i))) =
            PackBf16(sacc[r][i], sacc[r][i + 1]);
    wgmma::FenceSharedForAsync();
    // Past this barrier every warp is done with chunk − 1, so the next
    // chunk's copies may go to its stage.
    __syncthreads();
    if (chunk + 1 < num_chunks) issue(chunk + 1, st ^ 1);

    // 2. Every warp scans the chunk's decays itself (lane l holds b at rows
    //    2l and 2l + 1; gates past the chunk are 0), so no barrier waits on
    //    one warp; b_at(x) reads b at row x from its lane. S decays over the
    //    chunk (before the products, so that no register of a product in
    //    flight is written).
    const float* raw = reinterpret_cast<const float*>(base + Layout::kGate);
    const auto gate = [&](int i) {
      if (i >= lc || p.left.ptr == nullptr) return 0.0f;
      return p.left.fn == GateFn::kLogSigmoid ? LogSigmoid(raw[i]) : raw[i];
    };
    const float x1 = gate(2 * lane + 1);
    float b1 = gate(2 * lane) + x1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(kAll, b1, off);
      if (lane >= off) b1 += y;
    }
    const float b0 = b1 - x1;
    const float b_last = __shfl_sync(kAll, b1, 31);
    const auto b_at = [&](int x) {
      const float even = __shfl_sync(kAll, b0, x / 2), odd = __shfl_sync(kAll, b1, x / 2);
      return x % 2 ? odd : even;
    };

    const float decay = __expf(b_last);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i) sacc[r][i] *= decay;
    wgmma::Pin(sacc[0]);
    wgmma::Pin(sacc[1]);

    // 3. Q Kᵀ and Q S on the tensor cores (unconditionally: a branch between
    //    the issues would make the compiler serialize them).
    float acc_a[32], acc_o[32];
    wgmma::Fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const int col = wgmma::Swizzled(C, 0, 16 * kk);
      const uint64_t qd = wgmma::SwizzledKMajor(base + Layout::kQ + col);
      wgmma::MmaShared<0, 0>(acc_a, qd, wgmma::SwizzledKMajor(base + Layout::kK + col), kk > 0);
      wgmma::MmaShared<0, 1>(
          acc_o, qd,
          wgmma::SwizzledMnMajor(smem + Layout::kS + wgmma::Swizzled(kKeys, 16 * kk, 0), kKeys),
          kk > 0);
    }
    wgmma::Commit();

    // 4. V̂ = diag(k_scale·e^{b_C − b_j}) V in a tile of its own (V feeds A V):
    //    warp w its rows 16w.., 16 bytes (8 columns of a row) a piece.
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int piece = 16 * 8 * warp + lane + 32 * u, j = piece / 8;
      const float bj = b_at(j);
      const float w = j < lc ? p.k_scale * __expf(b_last - bj) : 0.0f;
      uint4 x = *reinterpret_cast<const uint4*>(base + Layout::kV + 16 * piece);
      x.x = Scale2(x.x, w, w), x.y = Scale2(x.y, w, w);
      x.z = Scale2(x.z, w, w), x.w = Scale2(x.w, w, w);
      *reinterpret_cast<uint4*>(smem + Layout::kVhat + 16 * piece) = x;
    }
    wgmma::FenceSharedForAsync();

    // 5. The factors of A, qk_scale·e^{b_i − b_j} where j ≤ i (else
    //    e^{−∞} = 0, no branch), and of Q S's rows, while Q Kᵀ runs.
    const int row0 = 16 * warp + g;  // this thread's rows: row0 and row0 + 8
    const float b_r0 = b_at(row0), b_r8 = b_at(row0 + 8);
    float factor[32];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const int j = 8 * nb + 2 * t4;
      const float bj0 = __shfl_sync(kAll, b0, 4 * nb + t4);
      const float bj1 = __shfl_sync(kAll, b1, 4 * nb + t4);
      factor[4 * nb] = qk_scale * __expf(j <= row0 ? b_r0 - bj0 : -INFINITY);
      factor[4 * nb + 1] = qk_scale * __expf(j + 1 <= row0 ? b_r0 - bj1 : -INFINITY);
      factor[4 * nb + 2] = qk_scale * __expf(j <= row0 + 8 ? b_r8 - bj0 : -INFINITY);
      factor[4 * nb + 3] = qk_scale * __expf(j + 1 <= row0 + 8 ? b_r8 - bj1 : -INFINITY);
    }
    const float rs0 = p.q_scale * __expf(b_r0), rs8 = p.q_scale * __expf(b_r8);
    wgmma::Wait<0>();
    wgmma::Pin(acc_a);
    wgmma::Pin(acc_o);
    // Past this barrier V̂ is whole and no warp reads this chunk's S copy any
    // more (the next chunk rewrites it before its first barrier).
    __syncthreads();

    // 6. S += Kᵀ V̂ (Kᵀ: k's tile read MN-major, keys as M); meanwhile A,
    //    masked and weighted, becomes the bf16 A fragments of A V (n-tile nb
    //    of the accumulator is half of k-step nb / 2), and Q S's rows are
    //    weighted; then O += A V.
    wgmma::Fence();
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk)
        wgmma::MmaShared<1, 1>(
            sacc[r],
            wgmma::SwizzledMnMajor(base + Layout::kK + wgmma::Swizzled(C, 16 * kk, 64 * r), C),
            wgmma::SwizzledMnMajor(smem + Layout::kVhat + wgmma::Swizzled(C, 16 * kk, 0), C), true);
    wgmma::Commit();
    uint32_t afrag[4][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      afrag[nb / 2][nb % 2 * 2] =
          PackBf16(acc_a[4 * nb] * factor[4 * nb], acc_a[4 * nb + 1] * factor[4 * nb + 1]);
      afrag[nb / 2][nb % 2 * 2 + 1] =
          PackBf16(acc_a[4 * nb + 2] * factor[4 * nb + 2], acc_a[4 * nb + 3] * factor[4 * nb + 3]);
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_o[i] *= i / 2 % 2 ? rs8 : rs0;
    wgmma::Pin(acc_o);
    wgmma::Fence();
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk)
      wgmma::MmaRegisterA<1>(
          acc_o, afrag[kk],
          wgmma::SwizzledMnMajor(base + Layout::kV + wgmma::Swizzled(C, 16 * kk, 0), C), true);
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::Pin(acc_o);
    wgmma::Pin(sacc[0]);
    wgmma::Pin(sacc[1]);

    // 7. The outputs of the chunk's live rows. 16-bit ones: each warp stages
    //    its 16 rows in this stage's q tile (free until the copies of chunk
    //    + 2, issued past the next chunk's barrier) and copies them out by rows.
    if (stage_out) {
      void* staged = base + Layout::kQ;
#pragma unroll
      for (int i = 0; i < 32; i += 2)
        StorePair(staged, p.o_type, wgmma::Swizzled(C, row0 + 8 * (i / 2 % 2), s_col(i)) / 2,
                  acc_o[i], acc_o[i + 1]);
      __syncwarp();
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = 16 * warp + (lane + 32 * u) / 8, col = 8 * (lane % 8);
        if (r < lc)
          *reinterpret_cast<uint4*>(static_cast<bf16*>(p.o) +
                                    ((bos + c0 + r) * p.heads + h) * p.dv + e0 + col) =
              *reinterpret_cast<const uint4*>(base + Layout::kQ + wgmma::Swizzled(C, r, col));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const int r = row0 + 8 * (i / 2 % 2);
        if (r < lc)
          StorePair(p.o, p.o_type, ((bos + c0 + r) * p.heads + h) * p.dv + e0 + s_col(i), acc_o[i],
                    acc_o[i + 1]);
      }
    }
  }

  if (p.s_final.ptr) {
    const int slot = p.s_final.slot ? p.s_final.slot[seq] : seq;
    float* base = p.s_final.ptr + slot * p.s_final.slot_stride + head_off;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i)
        base[static_cast<int64_t>(s_row(r, i)) * p.s_final.stride_a +
             static_cast<int64_t>(e0 + s_col(i)) * p.s_final.stride_b] = sacc[r][i];
  }
#else
  (void)p;  // never launched: WgmmaAvailable() is false without an sm_90a image
#endif
}

bool Bf16Aligned(const Operand& op) {
  return op.type == ElemType::kBF16 && reinterpret_cast<uintptr_t>(op.ptr) % 16 == 0;
}

}  // namespace

bool ScanWgmmaSupports(const ScanParams& p) {
  return Bf16Aligned(p.q) && Bf16Aligned(p.k) && Bf16Aligned(p.v) && p.dk == kKeys && p.dv > 0 &&
         p.dv % kTileV == 0 && !p.reverse && !p.left_vector && !p.left.shift &&
         p.right.ptr == nullptr && p.key_weight.ptr == nullptr && !p.stabilize &&
         p.row_weight.ptr == nullptr && !p.extra_key && p.row_dots == nullptr &&
         p.norm_dot == nullptr && p.norm == NormKind::kNone && p.n_init == nullptr &&
         p.n_final == nullptr && p.m_init == nullptr && p.m_final == nullptr &&
         p.heads % p.v_head_share == 0;
}

bool WgmmaAvailable() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attributes;
  if (cudaFuncGetAttributes(&attributes, ScanWgmmaKernel) != cudaSuccess) {
    cudaGetLastError();  // no image for this device: not an error of the launch to come
    return false;
  }
  return true;
}

cudaError_t LaunchScanWgmma(const ScanParams& p, cudaStream_t stream) {
  const cudaError_t err = cudaFuncSetAttribute(
      ScanWgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout::kBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.dv / kTileV, p.heads, p.num_seqs);
  ScanWgmmaKernel<<<grid, kThreads, Layout::kBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
