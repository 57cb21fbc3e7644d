// The kernels of mixer_backward.h: the GSA softmax Jacobian, an fp32 add, and
// the mLSTM backward.
//
// mLSTM backward, per (sequence, head), kMlstmBackwardMaxDim threads; thread
// `tid` is value column tid in the column phases and key row tid in the row
// phases. Notation of kernels/cpu/mlstm.cc: q' = q/√K, C_t = fa C_{t-1} + ia k vᵀ,
// n_t = fa n_{t-1} + ia k, h_t = C_tᵀq' / den_t.
//   sweep: the state (C, n, m) entering every block of B tokens → scratch;
//   per block, last first: the gates (fa, ia, m and which branch of the max
//   won) into shared memory, C_t and n_t of every step into scratch; then per
//   step, last first, with dC in shared memory (padded rows), dn in the row
//   threads' registers and dm as an identical copy in every thread:
//     num = C_tᵀq', qn = q'·n_t, dnum = dh/den, and dqn or dm from the max of den;
//     X = dC + q' dnumᵀ,  dv = ia Xᵀk,  u = X v,  dn' = dn + dqn q';
//     dq = (C_t dnum + dqn n_t)/√K,  dk = ia (u + dn');
//     dfa = <X, C_{t-1}> + <dn', n_{t-1}>,  dia = k·(u + dn');
//     dC ← fa X,  dn ← fa dn', and the gate chain of ReverseStep in mlstm.cc.
// Every thread computes the same scalars from the same block sums, so the
// scalar chain (m, dm) needs no broadcast.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mixer_backward.h"

namespace lair::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMlstmThreads = kMlstmBackwardMaxDim;
constexpr int kWarps = kMlstmThreads / 32;

int Blocks(int64_t n, int per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// One warp per row.
__global__ void SoftmaxBackwardKernel(const float* p, float* dp, int64_t rows, int width) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* pr = p + r * width;
  float* dr = dp + r * width;
  float dot = 0.0f;
  for (int c = lane; c < width; c += 32) dot += pr[c] * dr[c];
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  for (int c = lane; c < width; c += 32) dr[c] = pr[c] * (dr[c] - dot);
}

__global__ void AddKernel(const float* a, const float* b, void* out, ElemType type, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreElem(out, type, i, a[i] + b[i]);
  }
}

struct StepGates {
  float fa, ia;
  float m;           // m_t (0 for the sigmoid kinds)
  bool forget_wins;  // m_t came from lf + m_{t-1} rather than the input gate
};

__device__ __forceinline__ StepGates GatesOf(MlstmGate kind, float i, float f, float m_prev) {
  const float lf = LogSigmoid(f);
  if (kind == MlstmGate::kExp) {
    const float forget = lf + m_prev;
    const float m = fmaxf(forget, i);
    return {expf(forget - m), expf(i - m), m, forget >= i};
  }
  return {expf(lf), expf(LogSigmoid(i)), 0.0f, true};
}

__device__ __forceinline__ float Sigmoid(float x) { return expf(LogSigmoid(x)); }

__device__ __forceinline__ float Denominator(MlstmGate kind, float qn, float m, float eps) {
  switch (kind) {
    case MlstmGate::kExp:
      return fmaxf(fabsf(qn), expf(-m)) + eps;
    case MlstmGate::kSigNorm:
      return fmaxf(fabsf(qn), 1.0f) + eps;
    case MlstmGate::kSig:
      break;
  }
  return 1.0f;
}

// Sum over the CTA, returned to every thread in the same order; red holds kWarps floats.
__device__ __forceinline__ float BlockSum(float x, float* red) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += red[w];
  __syncthreads();
  return total;
}

// Floats of scratch per (sequence, head) and of dynamic shared memory.
__host__ __device__ int64_t TaskScratchFloats(int dk, int dv, int max_len, int block) {
  const int64_t kv = static_cast<int64_t>(dk) * dv;
  const int64_t checkpoints = (max_len + block - 1) / block;
  return checkpoints * (kv + dk + 1) + static_cast<int64_t>(block) * (kv + dk);
}

int64_t SharedFloats(const MlstmBackwardParams& p) {
  return static_cast<int64_t>(p.dk) * (p.dv + 1) + 4 * kMlstmBackwardMaxDim + kWarps + 4 * p.block;
}

__global__ void __launch_bounds__(kMlstmThreads, 1) MlstmBackwardKernel(const MlstmBackwardParams p) {
  extern __shared__ float smem[];
  const int K = p.dk, V = p.dv, B = p.block, H = p.heads, VP = V + 1;
  float* dC = smem;                          // [K][VP]
  float* qs = dC + K * VP;                   // q' of the step [K]
  float* ks = qs + kMlstmBackwardMaxDim;     // k [K]
  float* vs = ks + kMlstmBackwardMaxDim;     // v [V]
  float* dnum_s = vs + kMlstmBackwardMaxDim; // dnum [V]
  float* red = dnum_s + kMlstmBackwardMaxDim;
  float* g_fa = red + kWarps;                // gates of the block's steps [B] each
  float* g_ia = g_fa + B;
  float* g_m = g_ia + B;
  float* g_win = g_m + B;

  const int tid = threadIdx.x;
  const int64_t task = blockIdx.x;
  const int seq = static_cast<int>(task / H), h = static_cast<int>(task % H);
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const int64_t kv = static_cast<int64_t>(K) * V;
  const int64_t ldk = static_cast<int64_t>(H) * K, ldv = static_cast<int64_t>(H) * V;
  const int max_blocks = (p.max_len + B - 1) / B;
  float* ckpt_c = p.scratch + task * TaskScratchFloats(K, V, p.max_len, B);
  float* ckpt_n = ckpt_c + max_blocks * kv;
  float* ckpt_m = ckpt_n + static_cast<int64_t>(max_blocks) * K;
  float* step_c = ckpt_m + max_blocks;  // [B][K][V] states of the block being walked
  float* step_n = step_c + B * kv;
  const int blocks = (len + B - 1) / B;
  const bool col = tid < V, row = tid < K;
  const float scale = 1.0f / sqrtf(static_cast<float>(K));

  // Forward sweep: checkpoint b is the state entering block b.
  float m = 0.0f;
  if (blocks > 0) {
    const int64_t slot_head = p.c_init ? static_cast<int64_t>(p.slot[seq]) * H + h : 0;
    if (p.m_init) m = p.m_init[slot_head];
    if (col)
      for (int r = 0; r < K; ++r) ckpt_c[r * V + tid] = p.c_init ? p.c_init[slot_head * kv + r * V + tid] : 0.0f;
    if (row) ckpt_n[tid] = p.c_init ? p.n_init[slot_head * K + tid] : 0.0f;
  }
  for (int b = 0; b < blocks; ++b) {
    if (tid == 0) ckpt_m[b] = m;
    if (b + 1 == blocks) break;  // the state leaving the last block is not needed
    const float* c_cur = ckpt_c + b * kv;
    float* c_next = ckpt_c + (b + 1) * kv;
    if (col)
      for (int r = 0; r < K; ++r) c_next[r * V + tid] = c_cur[r * V + tid];
    if (row) ckpt_n[(b + 1) * K + tid] = ckpt_n[b * K + tid];
    for (int t = b * B; t < (b + 1) * B; ++t) {
      const int64_t tok = bos + t;
      const StepGates gates = GatesOf(p.gate, p.i[tok * H + h], p.f[tok * H + h], m);
      const int64_t qk = tok * ldk + static_cast<int64_t>(h) * K;
      if (col) {
        const float vv = LoadElem(p.v.ptr, p.v.type, tok * ldv + static_cast<int64_t>(h) * V + tid);
        for (int r = 0; r < K; ++r) {
          const float w = gates.ia * LoadElem(p.k.ptr, p.k.type, qk + r);
          c_next[r * V + tid] = gates.fa * c_next[r * V + tid] + w * vv;
        }
      }
      if (row) {
        float* n_next = ckpt_n + (b + 1) * K + tid;
        *n_next = gates.fa * *n_next + gates.ia * LoadElem(p.k.ptr, p.k.type, qk + tid);
      }
      m = gates.m;
    }
  }

  // Cotangents of the final state.
  if (col)
    for (int r = 0; r < K; ++r) dC[r * VP + tid] = p.d_ct ? p.d_ct[task * kv + r * V + tid] : 0.0f;
  float dn = row && p.d_nt ? p.d_nt[task * K + tid] : 0.0f;
  float dm = 0.0f;

  for (int b = blocks - 1; b >= 0; --b) {
    const int t0 = b * B, steps = min(B, len - t0);
    if (tid == 0) {
      float mm = ckpt_m[b];
      for (int j = 0; j < steps; ++j) {
        const int64_t tok = bos + t0 + j;
        const StepGates gates = GatesOf(p.gate, p.i[tok * H + h], p.f[tok * H + h], mm);
        g_fa[j] = gates.fa;
        g_ia[j] = gates.ia;
        g_m[j] = gates.m;
        g_win[j] = gates.forget_wins ? 1.0f : 0.0f;
        mm = gates.m;
      }
    }
    __syncthreads();
    // The state after step j of the block is at step_c + j·kv; the one
    // entering it is checkpoint b.
    const float* c_in = ckpt_c + b * kv;
    const float* n_in = ckpt_n + static_cast<int64_t>(b) * K;
    for (int j = 0; j < steps; ++j) {
      const int64_t tok = bos + t0 + j;
      const int64_t qk = tok * ldk + static_cast<int64_t>(h) * K;
      if (col) {
        const float vv = LoadElem(p.v.ptr, p.v.type, tok * ldv + static_cast<int64_t>(h) * V + tid);
        const float* prev = j == 0 ? c_in : step_c + (j - 1) * kv;
        float* cur = step_c + j * kv;
        for (int r = 0; r < K; ++r) {
          const float w = g_ia[j] * LoadElem(p.k.ptr, p.k.type, qk + r);
          cur[r * V + tid] = g_fa[j] * prev[r * V + tid] + w * vv;
        }
      }
      if (row) {
        const float prev = j == 0 ? n_in[tid] : step_n[static_cast<int64_t>(j - 1) * K + tid];
        step_n[static_cast<int64_t>(j) * K + tid] =
            g_fa[j] * prev + g_ia[j] * LoadElem(p.k.ptr, p.k.type, qk + tid);
      }
    }
    __syncthreads();

    for (int j = steps - 1; j >= 0; --j) {
      const int64_t tok = bos + t0 + j;
      const int64_t qk = tok * ldk + static_cast<int64_t>(h) * K;
      const int64_t vo = tok * ldv + static_cast<int64_t>(h) * V;
      const float fa = g_fa[j], ia = g_ia[j], mt = g_m[j];
      const bool forget_wins = g_win[j] != 0.0f;
      const float* c_t = step_c + j * kv;
      const float* c_prev = j == 0 ? c_in : step_c + (j - 1) * kv;
      const float* n_t = step_n + static_cast<int64_t>(j) * K;
      const float* n_prev = j == 0 ? n_in : step_n + static_cast<int64_t>(j - 1) * K;
      if (row) {
        qs[tid] = scale * LoadElem(p.q.ptr, p.q.type, qk + tid);
        ks[tid] = LoadElem(p.k.ptr, p.k.type, qk + tid);
      }
      float dh = 0.0f;
      if (col) {
        vs[tid] = LoadElem(p.v.ptr, p.v.type, vo + tid);
        dh = LoadElem(p.dh.ptr, p.dh.type, vo + tid);
      }
      __syncthreads();

      // h = num / den.
      float num = 0.0f;
      if (col)
        for (int r = 0; r < K; ++r) num += qs[r] * c_t[r * V + tid];
      const float qn = BlockSum(row ? qs[tid] * n_t[tid] : 0.0f, red);
      const float den = Denominator(p.gate, qn, mt, p.eps);
      const float dnum = dh / den;
      if (col) dnum_s[tid] = dnum;
      const float dh_dot_h = BlockSum(col ? dnum * num : 0.0f, red);
      float dqn = 0.0f;
      if (p.gate != MlstmGate::kSig) {
        const float lower_bound = p.gate == MlstmGate::kExp ? expf(-mt) : 1.0f;
        if (fabsf(qn) >= lower_bound) {
          dqn = -dh_dot_h / den * (qn >= 0.0f ? 1.0f : -1.0f);
        } else if (p.gate == MlstmGate::kExp) {
          // ∂den/∂m = −e^{−m}; e^{−m}/den = 1/(1 + eps·e^{m}) stays finite.
          dm += dh_dot_h / (1.0f + p.eps * expf(mt));
        }
      }

      // Column phase: X = dC + q' dnumᵀ, dv, <X, C_{t-1}>.
      float dfa_part = 0.0f;
      if (col) {
        float dv_acc = 0.0f;
        for (int r = 0; r < K; ++r) {
          const float x = dC[r * VP + tid] + qs[r] * dnum;
          dfa_part += x * c_prev[r * V + tid];
          dv_acc += ks[r] * x;
          dC[r * VP + tid] = x;
        }
        StoreElem(p.dv_out, p.dv_type, vo + tid, ia * dv_acc);
      }
      __syncthreads();

      // Row phase: u = X v, dq, dk, dn, and dC ← fa X.
      float dia_part = 0.0f;
      if (row) {
        const float* c_row = c_t + static_cast<int64_t>(tid) * V;
        float* dc_row = dC + tid * VP;
        float u = 0.0f, dq_acc = dqn * n_t[tid];
        for (int c = 0; c < V; ++c) {
          u += dc_row[c] * vs[c];
          dq_acc += c_row[c] * dnum_s[c];
          dc_row[c] *= fa;
        }
        StoreElem(p.dq, p.dq_type, qk + tid, scale * dq_acc);
        const float dn_t = dn + dqn * qs[tid];
        dfa_part += dn_t * n_prev[tid];
        dia_part = ks[tid] * (u + dn_t);
        StoreElem(p.dk_out, p.dk_type, qk + tid, ia * (u + dn_t));
        dn = fa * dn_t;
      }
      const float dfa = BlockSum(dfa_part, red);
      const float dia = BlockSum(dia_part, red);

      // Gates.
      const float ig = p.i[tok * H + h], fg = p.f[tok * H + h];
      float dlf = 0.0f, di = 0.0f;
      if (p.gate == MlstmGate::kExp) {
        const float dx = dfa * fa;  // fa = e^{lf + m_{t-1} − m_t}
        const float dy = dia * ia;  // ia = e^{i − m_t}
        const float dm_t = dm - dx - dy;
        float dm_prev = dx;
        dlf = dx;
        di = dy;
        if (forget_wins) {
          dlf += dm_t;
          dm_prev += dm_t;
        } else {
          di += dm_t;
        }
        dm = dm_prev;
      } else {
        dlf = dfa * fa;
        di = dia * ia * Sigmoid(-ig);
      }
      if (tid == 0) {
        p.df[tok * H + h] = dlf * Sigmoid(-fg);
        p.di[tok * H + h] = di;
      }
    }
  }

  // dC and dn now belong to the initial state.
  if (p.d_c0 && col)
    for (int r = 0; r < K; ++r) p.d_c0[task * kv + r * V + tid] = dC[r * VP + tid];
  if (p.d_n0 && row) p.d_n0[task * K + tid] = dn;
}

}  // namespace

cudaError_t LaunchSoftmaxBackward(const float* p, float* dp, int64_t rows, int width,
                                  cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  SoftmaxBackwardKernel<<<Blocks(rows, kThreads / 32), kThreads, 0, stream>>>(p, dp, rows, width);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, void* out, ElemType out_type, int64_t count,
                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  AddKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(a, b, out, out_type, count);
  return cudaGetLastError();
}

int64_t MlstmBackwardScratchFloats(const MlstmBackwardParams& p) {
  return static_cast<int64_t>(p.num_seqs) * p.heads * TaskScratchFloats(p.dk, p.dv, p.max_len, p.block);
}

cudaError_t LaunchMlstmBackward(const MlstmBackwardParams& p, cudaStream_t stream) {
  const int64_t tasks = static_cast<int64_t>(p.num_seqs) * p.heads;
  if (tasks == 0) return cudaSuccess;
  if (p.dk < 1 || p.dv < 1 || p.dk > kMlstmBackwardMaxDim || p.dv > kMlstmBackwardMaxDim || p.block < 1)
    return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(SharedFloats(p)) * sizeof(float);
  const cudaError_t err = cudaFuncSetAttribute(MlstmBackwardKernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  MlstmBackwardKernel<<<static_cast<unsigned>(tasks), kMlstmThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
