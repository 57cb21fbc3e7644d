// mLSTM forward and backward, fp32, one (sequence, head) per task.
//
// Notation of specs/mlstm.md, per head: q' = q/√K, lf_t = logσ(f~_t); the
// log input gate is li_t = i~_t (kExp) or logσ(i~_t) (kSig, kSigNorm). The
// sigmoid kinds are the kExp algebra with the stabilizer pinned at m ≡ 0
// (every exponent is ≤ 0 already), so one code path serves all three.
//
// Recurrent step (spec §1.2, §7.3):
//   m_t = max(lf_t + m_{t-1}, li_t)                  (kExp; 0 otherwise)
//   fa_t = e^{lf_t + m_{t-1} - m_t},  ia_t = e^{li_t - m_t}
//   C_t = fa_t C_{t-1} + ia_t k_t v_tᵀ,  n_t = fa_t n_{t-1} + ia_t k_t
//   h_t = C_tᵀq' / den_t,  den_t = max(|q'ᵀn_t|, e^{-m_t}) + eps  (kExp)
//                                  max(|q'ᵀn_t|, 1) + eps        (kSigNorm)
//                                  1                             (kSig)
//
// Chunkwise form (spec §2.2–2.5), chunk of L tokens (the last may be short),
// state (C, n, m) entering the chunk:
//   1. gates: b = cumsum(lf) (inclusive), g = b_L,
//      a_j = Σ_{l>j} lf_l + li_j (a true exclusive reverse cumsum);
//   2. stabilizers: m_comb_i = max(b_i + m, max_{j≤i} (b_i - b_j + li_j)),
//      which equals the recurrent m_t, so outputs match the step form;
//   3. intra: S_ij = (q'_i·k_j) e^{b_i - b_j + li_j - m_comb_i} for j ≤ i;
//   4. inter: Q̄_i = q'_i e^{b_i + m - m_comb_i};
//      h_i = (Q̄ C + S V)_i / den_i with q'ᵀn_t = Q̄_i·n + Σ_j S_ij;
//   5. state: m' = max(g + m, max_j a_j),
//      C ← e^{g+m-m'} C + (K ⊙ e^{a-m'})ᵀ V,  n ← e^{g+m-m'} n + (K ⊙ e^{a-m'})ᵀ 1.
// The three products of steps 3–5 go through cblas_sgemm.
//
// Backward: reverse mode through the recurrent step, exact (it follows m
// through the max and the denominator through its max). The forward is swept
// once to keep (C, n, m) at the start of every chunk; each chunk is then
// recomputed step by step and walked backwards, so memory is O(T/L + L)
// states per task. Scalar reductions are accumulated in double.
#include "kernels/cpu/mlstm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/mixer_checks.h"
#include "kernels/cpu/parallel.h"

namespace lair::kernels::cpu {
namespace {

float LogSigmoid(float x) { return std::min(x, 0.0f) - std::log1p(std::exp(-std::fabs(x))); }
float Sigmoid(float x) { return std::exp(LogSigmoid(x)); }

absl::Status CheckForwardArgs(const SequenceBatch& batch, const MlstmForwardArgs& args,
                              const std::string& prefix) {
  LAIR_RETURN_IF_ERROR(CheckPositive(args.heads, prefix + "heads"));
  LAIR_RETURN_IF_ERROR(CheckPositive(args.key_dim, prefix + "key_dim"));
  LAIR_RETURN_IF_ERROR(CheckPositive(args.value_dim, prefix + "value_dim"));
  LAIR_RETURN_IF_ERROR(CheckPositive(args.chunk_size, prefix + "chunk_size"));
  LAIR_RETURN_IF_ERROR(CheckRank(args.q, prefix + "q", 3));
  LAIR_RETURN_IF_ERROR(CheckRank(args.state_c, prefix + "state_c", 4));
  const int64_t n = args.q.dim(0), h = args.heads, k = args.key_dim, v = args.value_dim;
  const int64_t slots = args.state_c.dim(0);
  LAIR_RETURN_IF_ERROR(CheckTensor(args.q, prefix + "q", {n, h, k}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.k, prefix + "k", {n, h, k}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.v, prefix + "v", {n, h, v}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.i, prefix + "i", {n, h}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.f, prefix + "f", {n, h}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckTensor(args.state_c, prefix + "state_c", {slots, h, k, v}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.state_n, prefix + "state_n", {slots, h, k}, Floats::kF32));
  if (args.kind == MlstmKind::kExp) {
    LAIR_RETURN_IF_ERROR(CheckTensor(args.state_m, prefix + "state_m", {slots, h}, Floats::kF32));
  }
  if (args.norm_dot.defined()) {
    if (args.kind == MlstmKind::kSig)
      return absl::InvalidArgumentError(prefix + "norm_dot: the sig kind has no normalizer");
    LAIR_RETURN_IF_ERROR(CheckTensor(args.norm_dot, prefix + "norm_dot", {n, h}, Floats::kF32));
  }
  return CheckSequenceBatch(batch, n, slots, /*distinct_slots=*/true);
}

// Sizes and strides shared by every task of a launch.
struct Dims {
  MlstmKind kind;
  int64_t heads, key_dim, value_dim;
  float eps;
  float scale;  // 1/√K
  int64_t chunk;

  explicit Dims(const MlstmForwardArgs& args)
      : kind(args.kind),
        heads(args.heads),
        key_dim(args.key_dim),
        value_dim(args.value_dim),
        eps(args.eps),
        scale(1.0f / std::sqrt(static_cast<float>(args.key_dim))),
        chunk(args.chunk_size) {}
  int64_t ldk() const { return heads * key_dim; }    // row stride of q, k
  int64_t ldv() const { return heads * value_dim; }  // row stride of v, h
  int64_t state_size() const { return key_dim * value_dim; }
};

// One (sequence, head): pointers to its first token. Rows are ldk/ldv/heads apart.
struct HeadInputs {
  int64_t len = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* i = nullptr;
  const float* f = nullptr;
};

HeadInputs InputsOf(const Dims& d, const SequenceBatch& batch, const MlstmForwardArgs& args,
                    int64_t seq, int64_t head) {
  const int64_t begin = batch.cu_seqlens[seq];
  HeadInputs in;
  in.len = batch.cu_seqlens[seq + 1] - begin;
  in.q = args.q.f32() + begin * d.ldk() + head * d.key_dim;
  in.k = args.k.f32() + begin * d.ldk() + head * d.key_dim;
  in.v = args.v.f32() + begin * d.ldv() + head * d.value_dim;
  in.i = args.i.f32() + begin * d.heads + head;
  in.f = args.f.f32() + begin * d.heads + head;
  return in;
}

// Stabilized gates of one step: C_t = fa·C_{t-1} + ia·k vᵀ.
struct StepGates {
  float fa, ia;
  float m;           // m_t (0 for the sigmoid kinds)
  bool forget_wins;  // m_t came from lf_t + m_{t-1} rather than li_t
};

StepGates GatesOf(MlstmKind kind, float i, float f, float m_prev) {
  const float lf = LogSigmoid(f);
  if (kind == MlstmKind::kExp) {
    const float forget = lf + m_prev;
    const float m = std::max(forget, i);
    return {std::exp(forget - m), std::exp(i - m), m, forget >= i};
  }
  return {std::exp(lf), Sigmoid(i), 0.0f, true};
}

void UpdateState(const Dims& d, const StepGates& gates, const float* k, const float* v, float* c,
                 float* n) {
  for (int64_t r = 0; r < d.key_dim; ++r) {
    float* row = c + r * d.value_dim;
    const float w = gates.ia * k[r];
    for (int64_t col = 0; col < d.value_dim; ++col) row[col] = gates.fa * row[col] + w * v[col];
    n[r] = gates.fa * n[r] + w;
  }
}

// den_t given q'ᵀn_t and m_t.
float Denominator(const Dims& d, float qn, float m) {
  switch (d.kind) {
    case MlstmKind::kExp:
      return std::max(std::fabs(qn), std::exp(-m)) + d.eps;
    case MlstmKind::kSigNorm:
      return std::max(std::fabs(qn), 1.0f) + d.eps;
    case MlstmKind::kSig:
      break;
  }
  return 1.0f;
}

// h = C_tᵀq' / den_t for one token; returns q'ᵀn_t.
float ReadOut(const Dims& d, const float* q, const float* c, const float* n, float m, float* h) {
  std::fill(h, h + d.value_dim, 0.0f);
  float qn = 0.0f;
  for (int64_t r = 0; r < d.key_dim; ++r) {
    const float qr = d.scale * q[r];
    const float* row = c + r * d.value_dim;
    for (int64_t col = 0; col < d.value_dim; ++col) h[col] += qr * row[col];
    qn += qr * n[r];
  }
  const float inv = 1.0f / Denominator(d, qn, m);
  for (int64_t col = 0; col < d.value_dim; ++col) h[col] *= inv;
  return qn;
}

// norm_dot (row stride heads) takes q'ᵀn_t of every token, where not null.
void RecurrentForward(const Dims& d, const HeadInputs& in, float* h, float* norm_dot, float* c,
                      float* n, float* m) {
  for (int64_t t = 0; t < in.len; ++t) {
    const StepGates gates = GatesOf(d.kind, in.i[t * d.heads], in.f[t * d.heads], *m);
    UpdateState(d, gates, in.k + t * d.ldk(), in.v + t * d.ldv(), c, n);
    *m = gates.m;
    const float qn = ReadOut(d, in.q + t * d.ldk(), c, n, *m, h + t * d.ldv());
    if (norm_dot) norm_dot[t * d.heads] = qn;
  }
}

// Per-task scratch of the chunkwise forward, sized for one chunk.
struct ChunkScratch {
  std::vector<float> b, a, li, m_comb, s, q_bar, k_bar;
  ChunkScratch(int64_t chunk, int64_t key_dim)
      : b(chunk),
        a(chunk),
        li(chunk),
        m_comb(chunk),
        s(chunk * chunk),
        q_bar(chunk * key_dim),
        k_bar(chunk * key_dim) {}
};

void ChunkedForward(const Dims& d, const HeadInputs& in, float* h, float* norm_dot, float* c,
                    float* n, float* m) {
  const int64_t chunk = std::min(d.chunk, in.len);
  ChunkScratch x(chunk, d.key_dim);
  const bool stabilized = d.kind == MlstmKind::kExp;
  const int64_t ldk = d.ldk(), ldv = d.ldv(), kd = d.key_dim, vd = d.value_dim;
  for (int64_t t0 = 0; t0 < in.len; t0 += chunk) {
    const int64_t len = std::min(chunk, in.len - t0);
    const float* q = in.q + t0 * ldk;
    const float* k = in.k + t0 * ldk;
    const float* v = in.v + t0 * ldv;
    float* out = h + t0 * ldv;
    const float m_in = *m;

    // 1. Gates in log space.
    float cum = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      const float i = in.i[(t0 + j) * d.heads];
      cum += LogSigmoid(in.f[(t0 + j) * d.heads]);
      x.b[j] = cum;
      x.li[j] = stabilized ? i : LogSigmoid(i);
    }
    const float g = x.b[len - 1];
    float rev = 0.0f;
    for (int64_t j = len - 1; j >= 0; --j) {
      x.a[j] = rev + x.li[j];
      rev += LogSigmoid(in.f[(t0 + j) * d.heads]);
    }

    // 2. Stabilizers m_comb (the recurrent m_t).
    for (int64_t r = 0; r < len; ++r) {
      float best = x.b[r] + m_in;
      for (int64_t j = 0; j <= r; ++j) best = std::max(best, x.b[r] - x.b[j] + x.li[j]);
      x.m_comb[r] = stabilized ? best : 0.0f;
    }

    // 3. Intra: S = (q'Kᵀ) ⊙ D, causal.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, len, len, kd, d.scale, q, ldk, k, ldk,
                0.0f, x.s.data(), len);
    for (int64_t r = 0; r < len; ++r) {
      float* row = x.s.data() + r * len;
      for (int64_t j = 0; j <= r; ++j) row[j] *= std::exp(x.b[r] - x.b[j] + x.li[j] - x.m_comb[r]);
      std::fill(row + r + 1, row + len, 0.0f);
    }

    // 4. Inter and output: h = (Q̄ C + S V) / den.
    for (int64_t r = 0; r < len; ++r) {
      const float w = d.scale * std::exp(x.b[r] + m_in - x.m_comb[r]);
      for (int64_t col = 0; col < kd; ++col) x.q_bar[r * kd + col] = w * q[r * ldk + col];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, len, vd, kd, 1.0f, x.q_bar.data(), kd, c,
                vd, 0.0f, out, ldv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, len, vd, len, 1.0f, x.s.data(), len, v,
                ldv, 1.0f, out, ldv);
    for (int64_t r = 0; r < len; ++r) {
      float qn = 0.0f;
      for (int64_t col = 0; col < kd; ++col) qn += x.q_bar[r * kd + col] * n[col];
      for (int64_t j = 0; j <= r; ++j) qn += x.s[r * len + j];
      if (norm_dot) norm_dot[(t0 + r) * d.heads] = qn;
      const float inv = 1.0f / Denominator(d, qn, x.m_comb[r]);
      for (int64_t col = 0; col < vd; ++col) out[r * ldv + col] *= inv;
    }

    // 5. State update.
    float m_out = g + m_in;
    for (int64_t j = 0; j < len; ++j) m_out = std::max(m_out, x.a[j]);
    if (!stabilized) m_out = 0.0f;
    const float decay = std::exp(g + m_in - m_out);
    for (int64_t j = 0; j < len; ++j) {
      const float w = std::exp(x.a[j] - m_out);
      for (int64_t col = 0; col < kd; ++col) x.k_bar[j * kd + col] = w * k[j * ldk + col];
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kd, vd, len, 1.0f, x.k_bar.data(), kd, v,
                ldv, decay, c, vd);
    for (int64_t col = 0; col < kd; ++col) {
      float sum = 0.0f;
      for (int64_t j = 0; j < len; ++j) sum += x.k_bar[j * kd + col];
      n[col] = decay * n[col] + sum;
    }
    *m = m_out;
  }
}

// Cotangents of one task in the backward walk.
struct HeadGrads {
  const float* dh = nullptr;  // row stride ldv
  float* dq = nullptr;        // row stride ldk
  float* dk = nullptr;
  float* dv = nullptr;  // row stride ldv
  float* di = nullptr;  // row stride heads
  float* df = nullptr;
};

// Reverse of one step t. c_prev/n_prev/m_prev hold the state before the step,
// c/n/m after it; dc, dn, dm arrive as the cotangents of (C_t, n_t, m_t) and
// leave as those of (C_{t-1}, n_{t-1}, m_{t-1}).
void ReverseStep(const Dims& d, const HeadInputs& in, const HeadGrads& out, int64_t t,
                 const StepGates& gates, const float* c_prev, const float* n_prev, const float* c,
                 const float* n, float* dc, float* dn, double* dm, std::vector<float>& num,
                 std::vector<float>& dnum) {
  const int64_t kd = d.key_dim, vd = d.value_dim;
  const float* q = in.q + t * d.ldk();
  const float* k = in.k + t * d.ldk();
  const float* v = in.v + t * d.ldv();
  const float* dh = out.dh + t * d.ldv();
  float* dq = out.dq + t * d.ldk();
  float* dk = out.dk + t * d.ldk();
  float* dv = out.dv + t * d.ldv();

  // h_t = num / den: the cotangents of num, q'ᵀn_t and m_t.
  std::fill(num.begin(), num.end(), 0.0f);
  double qn = 0.0;
  for (int64_t r = 0; r < kd; ++r) {
    const float qr = d.scale * q[r];
    for (int64_t col = 0; col < vd; ++col) num[col] += qr * c[r * vd + col];
    qn += static_cast<double>(qr) * n[r];
  }
  const float den = Denominator(d, static_cast<float>(qn), gates.m);
  double dh_dot_h = 0.0;
  for (int64_t col = 0; col < vd; ++col) {
    dnum[col] = dh[col] / den;
    dh_dot_h += static_cast<double>(dnum[col]) * num[col];
  }
  double dqn = 0.0;
  if (d.kind != MlstmKind::kSig) {
    const float lower_bound = d.kind == MlstmKind::kExp ? std::exp(-gates.m) : 1.0f;
    if (std::fabs(qn) >= lower_bound) {
      dqn = -dh_dot_h / den * (qn >= 0 ? 1.0 : -1.0);
    } else if (d.kind == MlstmKind::kExp) {
      // ∂den/∂m = -e^{-m}, and e^{-m}/den = 1 / (1 + eps·e^{m}) stays finite.
      *dm += dh_dot_h / (1.0 + d.eps * std::exp(static_cast<double>(gates.m)));
    }
  }

  // Read-out and update, one key row at a time.
  double dfa = 0.0, dia = 0.0;
  std::fill(dv, dv + vd, 0.0f);
  for (int64_t r = 0; r < kd; ++r) {
    const float qr = d.scale * q[r];
    float* dc_row = dc + r * vd;
    const float* c_row = c + r * vd;
    const float* c_prev_row = c_prev + r * vd;
    double dq_acc = dqn * n[r];
    double u = 0.0;
    for (int64_t col = 0; col < vd; ++col) {
      dq_acc += static_cast<double>(c_row[col]) * dnum[col];
      dc_row[col] += qr * dnum[col];
      dfa += static_cast<double>(dc_row[col]) * c_prev_row[col];
      u += static_cast<double>(dc_row[col]) * v[col];
      dv[col] += gates.ia * k[r] * dc_row[col];
      dc_row[col] *= gates.fa;
    }
    dq[r] = static_cast<float>(d.scale * dq_acc);
    dn[r] += static_cast<float>(dqn * qr);
    dfa += static_cast<double>(dn[r]) * n_prev[r];
    dia += k[r] * (u + dn[r]);
    dk[r] = static_cast<float>(gates.ia * (u + dn[r]));
    dn[r] *= gates.fa;
  }

  // Gates.
  const float i = in.i[t * d.heads];
  const float f = in.f[t * d.heads];
  double dlf = 0.0, di = 0.0;
  if (d.kind == MlstmKind::kExp) {
    const double dx = dfa * gates.fa;  // fa = e^{lf + m_{t-1} - m_t}
    const double dy = dia * gates.ia;  // ia = e^{i - m_t}
    const double dm_t = *dm - dx - dy;
    double dm_prev = dx;
    dlf = dx;
    di = dy;
    if (gates.forget_wins) {
      dlf += dm_t;
      dm_prev += dm_t;
    } else {
      di += dm_t;
    }
    *dm = dm_prev;
  } else {
    dlf = dfa * gates.fa;
    di = dia * gates.ia * Sigmoid(-i);
  }
  out.df[t * d.heads] = static_cast<float>(dlf * Sigmoid(-f));
  out.di[t * d.heads] = static_cast<float>(di);
}

}  // namespace

absl::Status MlstmForwardCpu(const SequenceBatch& batch, const MlstmForwardArgs& args,
                             MixerForm form, int threads) {
  LAIR_RETURN_IF_ERROR(CheckForwardArgs(batch, args, "MlstmForwardArgs."));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.h, "MlstmForwardArgs.h", args.v.shape(), Floats::kF32));
  const Dims d(args);
  const int64_t num_tokens = args.q.dim(0);
  const bool recurrent =
      form == MixerForm::kRecurrent || (form == MixerForm::kAuto && num_tokens == batch.num_seqs);
  ParallelFor(int64_t{batch.num_seqs} * d.heads, threads, [&](int64_t task) {
    const int64_t seq = task / d.heads, head = task % d.heads;
    const int64_t slot_head = int64_t{batch.state_slot[seq]} * d.heads + head;
    float* c = args.state_c.f32() + slot_head * d.state_size();
    float* n = args.state_n.f32() + slot_head * d.key_dim;
    float m_local = 0.0f;
    float* m = d.kind == MlstmKind::kExp ? args.state_m.f32() + slot_head : &m_local;
    if (batch.zero_initial_state) {
      std::fill(c, c + d.state_size(), 0.0f);
      std::fill(n, n + d.key_dim, 0.0f);
      *m = 0.0f;
    }
    const HeadInputs in = InputsOf(d, batch, args, seq, head);
    float* h = args.h.f32() + int64_t{batch.cu_seqlens[seq]} * d.ldv() + head * d.value_dim;
    float* norm_dot = args.norm_dot.defined()
                          ? args.norm_dot.f32() + int64_t{batch.cu_seqlens[seq]} * d.heads + head
                          : nullptr;
    if (recurrent) {
      RecurrentForward(d, in, h, norm_dot, c, n, m);
    } else {
      ChunkedForward(d, in, h, norm_dot, c, n, m);
    }
  });
  return absl::OkStatus();
}

absl::Status MlstmBackwardCpu(const SequenceBatch& batch, const MlstmBackwardArgs& args,
                              int threads) {
  const MlstmForwardArgs& fwd = args.fwd;
  LAIR_RETURN_IF_ERROR(CheckForwardArgs(batch, fwd, "MlstmBackwardArgs.fwd."));
  const Dims d(fwd);
  const int64_t num_tokens = fwd.q.dim(0), seqs = batch.num_seqs;
  const Shape qk_shape = {num_tokens, d.heads, d.key_dim};
  const Shape gate_shape = {num_tokens, d.heads};
  const Shape c_shape = {seqs, d.heads, d.key_dim, d.value_dim};
  const Shape n_shape = {seqs, d.heads, d.key_dim};
  LAIR_RETURN_IF_ERROR(CheckTensor(args.d_h, "MlstmBackwardArgs.d_h", fwd.v.shape(), Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_ct, "MlstmBackwardArgs.d_ct", c_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_nt, "MlstmBackwardArgs.d_nt", n_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dq, "MlstmBackwardArgs.dq", qk_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dk, "MlstmBackwardArgs.dk", qk_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dv, "MlstmBackwardArgs.dv", fwd.v.shape(), Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.di, "MlstmBackwardArgs.di", gate_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.df, "MlstmBackwardArgs.df", gate_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_c0, "MlstmBackwardArgs.d_c0", c_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_n0, "MlstmBackwardArgs.d_n0", n_shape, Floats::kF32));

  const int64_t kv = d.state_size(), kd = d.key_dim;
  ParallelFor(seqs * d.heads, threads, [&](int64_t task) {
    const int64_t seq = task / d.heads, head = task % d.heads;
    const HeadInputs in = InputsOf(d, batch, fwd, seq, head);
    const int64_t row0 = batch.cu_seqlens[seq];
    HeadGrads out;
    out.dh = args.d_h.f32() + row0 * d.ldv() + head * d.value_dim;
    out.dq = args.dq.f32() + row0 * d.ldk() + head * kd;
    out.dk = args.dk.f32() + row0 * d.ldk() + head * kd;
    out.dv = args.dv.f32() + row0 * d.ldv() + head * d.value_dim;
    out.di = args.di.f32() + row0 * d.heads + head;
    out.df = args.df.f32() + row0 * d.heads + head;

    // Sweep the forward once, keeping the state entering every chunk.
    const int64_t chunks = (in.len + d.chunk - 1) / d.chunk;
    std::vector<float> saved_c(chunks * kv), saved_n(chunks * kd), saved_m(chunks);
    std::vector<float> c(kv, 0.0f), n(kd, 0.0f);
    float m = 0.0f;
    if (!batch.zero_initial_state) {
      const int64_t slot_head = int64_t{batch.state_slot[seq]} * d.heads + head;
      std::memcpy(c.data(), fwd.state_c.f32() + slot_head * kv, kv * sizeof(float));
      std::memcpy(n.data(), fwd.state_n.f32() + slot_head * kd, kd * sizeof(float));
      if (d.kind == MlstmKind::kExp) m = fwd.state_m.f32()[slot_head];
    }
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      std::copy(c.begin(), c.end(), saved_c.begin() + chunk * kv);
      std::copy(n.begin(), n.end(), saved_n.begin() + chunk * kd);
      saved_m[chunk] = m;
      for (int64_t t = chunk * d.chunk; t < std::min(in.len, (chunk + 1) * d.chunk); ++t) {
        const StepGates gates = GatesOf(d.kind, in.i[t * d.heads], in.f[t * d.heads], m);
        UpdateState(d, gates, in.k + t * d.ldk(), in.v + t * d.ldv(), c.data(), n.data());
        m = gates.m;
      }
    }

    // Cotangents of the final state.
    std::vector<float> dc(kv, 0.0f), dn(kd, 0.0f);
    if (args.d_ct.defined())
      std::memcpy(dc.data(), args.d_ct.f32() + task * kv, kv * sizeof(float));
    if (args.d_nt.defined())
      std::memcpy(dn.data(), args.d_nt.f32() + task * kd, kd * sizeof(float));
    double dm = 0.0;

    // Walk the chunks backwards, recomputing each one's per-step states.
    const int64_t span = std::min(d.chunk, in.len);  // tokens recomputed at a time
    std::vector<float> step_c((span + 1) * kv), step_n((span + 1) * kd);
    std::vector<StepGates> step_gates(span);
    std::vector<float> num(d.value_dim), dnum(d.value_dim);
    for (int64_t chunk = chunks - 1; chunk >= 0; --chunk) {
      const int64_t t0 = chunk * d.chunk, len = std::min(d.chunk, in.len - t0);
      std::memcpy(step_c.data(), saved_c.data() + chunk * kv, kv * sizeof(float));
      std::memcpy(step_n.data(), saved_n.data() + chunk * kd, kd * sizeof(float));
      m = saved_m[chunk];
      for (int64_t j = 0; j < len; ++j) {
        float* c = step_c.data() + (j + 1) * kv;
        float* n = step_n.data() + (j + 1) * kd;
        std::memcpy(c, c - kv, kv * sizeof(float));
        std::memcpy(n, n - kd, kd * sizeof(float));
        step_gates[j] = GatesOf(d.kind, in.i[(t0 + j) * d.heads], in.f[(t0 + j) * d.heads], m);
        UpdateState(d, step_gates[j], in.k + (t0 + j) * d.ldk(), in.v + (t0 + j) * d.ldv(), c, n);
        m = step_gates[j].m;
      }
      for (int64_t j = len - 1; j >= 0; --j) {
        ReverseStep(d, in, out, t0 + j, step_gates[j], step_c.data() + j * kv,
                    step_n.data() + j * kd, step_c.data() + (j + 1) * kv,
                    step_n.data() + (j + 1) * kd, dc.data(), dn.data(), &dm, num, dnum);
      }
    }
    if (args.d_c0.defined())
      std::memcpy(args.d_c0.f32() + task * kv, dc.data(), kv * sizeof(float));
    if (args.d_n0.defined())
      std::memcpy(args.d_n0.f32() + task * kd, dn.data(), kd * sizeof(float));
  });
  return absl::OkStatus();
}

}  // namespace lair::kernels::cpu
