#include "kernels/cpu/decay.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/mixer_checks.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/ula_core.h"

namespace lair::kernels::cpu {
namespace {

// ---------------------------------------------------------------------------
// Validation.

// Log-decays must be ≤ 0: the chunked form relies on it to keep every
// exponent non-positive. NaN is refused too.
absl::Status CheckLogDecays(const Tensor& t, std::string_view name) {
  const float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!(p[i] <= 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": log-decay ", p[i],
                                                     " at flat index ", i,
                                                     " (log-decays must be <= 0)"));
    }
  }
  return absl::OkStatus();
}

// Checks everything the forward and backward both read; `distinct_slots`
// when the call writes the slots.
absl::Status CheckDecayInputs(const SequenceBatch& batch, const DecayForwardArgs& a,
                              bool distinct_slots) {
  LAIR_RETURN_IF_ERROR(CheckPositive(a.heads, "heads"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.key_dim, "key_dim"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.value_dim, "value_dim"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.chunk_size, "chunk_size"));
  LAIR_RETURN_IF_ERROR(CheckRank(a.q, "q", 3));
  const int64_t n = a.q.dim(0), h = a.heads, k = a.key_dim, v = a.value_dim;
  LAIR_RETURN_IF_ERROR(CheckTensor(a.q, "q", {n, h, k}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.k, "k", {n, h, k}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.v, "v", {n, h, v}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckRank(a.state, "state", 4));
  const int64_t slots = a.state.dim(0);
  LAIR_RETURN_IF_ERROR(CheckTensor(a.state, "state", {slots, h, k, v}, Floats::kF32));
  switch (a.kind) {
    case DecayKind::kNone:
      break;
    case DecayKind::kConstant:
      LAIR_RETURN_IF_ERROR(CheckTensor(a.log_gamma, "log_gamma", {h}, Floats::kF32));
      LAIR_RETURN_IF_ERROR(CheckLogDecays(a.log_gamma, "log_gamma"));
      break;
    case DecayKind::kScalar:
      LAIR_RETURN_IF_ERROR(CheckTensor(a.g, "g", {n, h}, Floats::kF32));
      LAIR_RETURN_IF_ERROR(CheckLogDecays(a.g, "g"));
      break;
    case DecayKind::kLeftRight:
      LAIR_RETURN_IF_ERROR(CheckTensor(a.gv, "gv", {n, h, v}, Floats::kF32));
      LAIR_RETURN_IF_ERROR(CheckLogDecays(a.gv, "gv"));
      if (!a.gk.defined()) break;  // no key-side decay
      [[fallthrough]];
    case DecayKind::kVector:
      LAIR_RETURN_IF_ERROR(CheckTensor(a.gk, "gk", {n, h, k}, Floats::kF32));
      LAIR_RETURN_IF_ERROR(CheckLogDecays(a.gk, "gk"));
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kind: unknown DecayKind ", static_cast<int>(a.kind)));
  }
  return CheckSequenceBatch(batch, n, slots, distinct_slots);
}

// ---------------------------------------------------------------------------
// Tensors and views.

// An F32 host view of an activation (the tensor itself when already F32).
Tensor AsF32(const Tensor& t) { return t.dtype() == DType::kF32 ? t : t.ToF32(); }

// Where to compute `dst` in F32: dst itself, or scratch for a 16-bit dst.
Tensor F32Target(const Tensor& dst) {
  return dst.dtype() == DType::kF32 ? dst : Tensor::Zeros(DType::kF32, dst.shape());
}

// Rounds `target` into `dst` when they differ (see F32Target).
void Commit(const Tensor& target, const Tensor& dst) {
  if (target.raw() == dst.raw()) return;
  const float* src = target.f32();
  uint16_t* out = dst.data<uint16_t>();
  const bool bf16 = dst.dtype() == DType::kBF16;
  for (int64_t i = 0; i < dst.numel(); ++i)
    out[i] = bf16 ? FloatToBF16(src[i]) : FloatToF16(src[i]);
}

// The rows of head `head` of the sequence starting at token `first` in a
// packed F32 [N, H, D] tensor.
RowsView Rows(const Tensor& t, int64_t first, int head, float scale = 1.0f) {
  const int64_t heads = t.dim(1), dim = t.dim(2);
  return RowsView{t.f32() + (first * heads + head) * dim, heads * dim, static_cast<int>(dim),
                  scale};
}

// The key-side log-decay lk of `a` for (sequence starting at `first`, head).
LogDecayView LeftDecay(const DecayForwardArgs& a, int64_t first, int head, bool shifted) {
  LogDecayView d;
  d.shifted = shifted;
  switch (a.kind) {
    case DecayKind::kNone:
      break;
    case DecayKind::kConstant:
      d.kind = LogDecayView::Kind::kScalar;
      d.base = a.log_gamma.f32() + head;
      d.stride = 0;
      break;
    case DecayKind::kScalar:
      d.kind = LogDecayView::Kind::kScalar;
      d.base = a.g.f32() + first * a.heads + head;
      d.stride = a.heads;
      break;
    case DecayKind::kVector:
    case DecayKind::kLeftRight:
      if (!a.gk.defined()) break;  // kLeftRight without a key-side decay
      d.kind = LogDecayView::Kind::kVector;
      d.base = a.gk.f32() + (first * a.heads + head) * a.key_dim;
      d.stride = int64_t{a.heads} * a.key_dim;
      break;
  }
  return d;
}

// The value-side log-decay lv (kLeftRight only).
LogDecayView RightDecay(const DecayForwardArgs& a, int64_t first, int head, bool shifted) {
  LogDecayView d;
  d.shifted = shifted;
  if (a.kind == DecayKind::kLeftRight) {
    d.kind = LogDecayView::Kind::kVector;
    d.base = a.gv.f32() + (first * a.heads + head) * a.value_dim;
    d.stride = int64_t{a.heads} * a.value_dim;
  }
  return d;
}

// exp of a side's log-decay at the first token of a view, per feature.
void FirstStepDecay(const LogDecayView& d, int dim, std::vector<float>& out) {
  out.assign(dim, 1.0f);
  if (d.kind == LogDecayView::Kind::kScalar) std::fill(out.begin(), out.end(), std::exp(d.base[0]));
  if (d.kind == LogDecayView::Kind::kVector) {
    for (int c = 0; c < dim; ++c) out[c] = std::exp(d.base[c]);
  }
}

// Below this many multiply-adds per call (a decode step of a few heads) the
// work runs on the calling thread: starting threads would cost more.
constexpr int64_t kMinParallelWork = int64_t{1} << 18;

int ThreadsFor(const SequenceBatch& batch, const DecayForwardArgs& a, int threads) {
  const int64_t tokens = batch.cu_seqlens[batch.num_seqs];
  return tokens * a.heads * a.key_dim * a.value_dim < kMinParallelWork ? 1 : threads;
}

UlaForm PickForm(const SequenceBatch& batch, MixerForm form) {
  if (form == MixerForm::kRecurrent) return UlaForm::kRecurrent;
  if (form == MixerForm::kChunked) return UlaForm::kChunked;
  for (int s = 0; s < batch.num_seqs; ++s) {
    if (batch.cu_seqlens[s + 1] - batch.cu_seqlens[s] > 1) return UlaForm::kChunked;
  }
  return UlaForm::kRecurrent;
}

// [rows, cols] row-major src into [cols, rows] dst.
void Transpose(const float* src, int rows, int cols, float* dst) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[int64_t{c} * rows + r] = src[int64_t{r} * cols + c];
  }
}

// ---------------------------------------------------------------------------
// Backward of one (sequence, head).

struct BackwardContext {
  const SequenceBatch& batch;
  const DecayBackwardArgs& args;
  UlaForm form;
  Tensor q, k, v, d_o;                     // F32 inputs
  Tensor dq, dk, dv;                       // F32 targets
  std::vector<double>& log_gamma_partial;  // [num_seqs * H], kConstant
};

void BackwardItem(const BackwardContext& c, int seq, int head) {
  const DecayForwardArgs& f = c.args.fwd;
  const int H = f.heads, K = f.key_dim, V = f.value_dim, chunk = f.chunk_size;
  const int64_t first = c.batch.cu_seqlens[seq];
  const int len = static_cast<int>(c.batch.cu_seqlens[seq + 1] - first);
  const int64_t kv = int64_t{K} * V;
  const float* s0 = c.batch.zero_initial_state
                        ? nullptr
                        : f.state.f32() + (int64_t{c.batch.state_slot[seq]} * H + head) * kv;
  const float* ds_n =
      c.args.d_ht.defined() ? c.args.d_ht.f32() + (int64_t{seq} * H + head) * kv : nullptr;
  const LogDecayView left = LeftDecay(f, first, head, false),
                     right = RightDecay(f, first, head, false);
  const LogDecayView left_next = LeftDecay(f, first, head, true);
  const LogDecayView right_next = RightDecay(f, first, head, true);

  // dq̃ = f(dO, V, K, R, L, fwd) from s0ᵀ (the transposed forward state); it
  // ends at s_nᵀ. dq = scale·dq̃ through the scale on dO.
  std::vector<float> s_t(kv, 0.0f);
  if (s0 != nullptr) Transpose(s0, K, V, s_t.data());
  UlaOperands ops;
  ops.length = len;
  ops.q = Rows(c.d_o, first, head, f.scale);
  ops.k = Rows(c.v, first, head);
  ops.v = Rows(c.k, first, head);
  ops.left = right;
  ops.right = left;
  ops.reverse = false;
  UlaPass(ops, c.form, chunk, s_t.data(), c.dq.f32() + (first * H + head) * K, int64_t{H} * K);

  // dV = f(K, q̃, dO, L+, R+, rev) from dS_n: its state is the adjoint G_t
  // (erratum U1: decays shifted by one step), ending at G_1.
  std::vector<float> g(kv, 0.0f);
  if (ds_n != nullptr) std::copy(ds_n, ds_n + kv, g.begin());
  ops.q = Rows(c.k, first, head);
  ops.k = Rows(c.q, first, head, f.scale);
  ops.v = Rows(c.d_o, first, head);
  ops.left = left_next;
  ops.right = right_next;
  ops.reverse = true;
  UlaPass(ops, c.form, chunk, g.data(), c.dv.f32() + (first * H + head) * V, int64_t{H} * V);

  // dK = f(V, dO, q̃, R+, L+, rev) from dS_nᵀ: the same adjoint, transposed.
  std::vector<float> g_t(kv, 0.0f);
  if (ds_n != nullptr) Transpose(ds_n, K, V, g_t.data());
  ops.q = Rows(c.v, first, head);
  ops.k = Rows(c.d_o, first, head);
  ops.v = Rows(c.q, first, head, f.scale);
  ops.left = right_next;
  ops.right = left_next;
  UlaPass(ops, c.form, chunk, g_t.data(), c.dk.f32() + (first * H + head) * K, int64_t{H} * K);

  // dS_0 = diag(λ_1) G_1 diag(γ_1).
  if (c.args.dh0.defined()) {
    std::vector<float> lam, gam;
    FirstStepDecay(len > 0 ? left : LogDecayView{}, K, lam);
    FirstStepDecay(len > 0 ? right : LogDecayView{}, V, gam);
    float* dst = c.args.dh0.f32() + (int64_t{seq} * H + head) * kv;
    for (int a = 0; a < K; ++a) {
      for (int b = 0; b < V; ++b) dst[a * V + b] = lam[a] * g[a * V + b] * gam[b];
    }
  }

  // Gate gradients (§1.7): with b_t = Σ_{u≤t} lk_u the loss sees q_t ⊙ e^{b_t}
  // and k_t ⊙ e^{−b_t}, so dL/dlk_t = Σ_{τ≥t} (q⊙dq − k⊙dk)_τ + rowsum(dS_n ⊙ s_n),
  // and on the value side Σ_{τ≥t} (o⊙do − v⊙dv)_τ + colsum(dS_n ⊙ s_n).
  const bool want_left =
      (f.kind == DecayKind::kConstant && c.args.d_log_gamma.defined()) ||
      (f.kind == DecayKind::kScalar && c.args.dg.defined()) ||
      ((f.kind == DecayKind::kVector || f.kind == DecayKind::kLeftRight) && c.args.dgk.defined());
  const bool want_right = f.kind == DecayKind::kLeftRight && c.args.dgv.defined();
  if (!want_left && !want_right) return;
  std::vector<double> tail_k(K, 0.0), tail_v(V, 0.0);
  if (ds_n != nullptr) {
    for (int a = 0; a < K; ++a) {
      for (int b = 0; b < V; ++b) {
        const double p = double{ds_n[a * V + b]} * s_t[int64_t{b} * K + a];
        tail_k[a] += p;
        tail_v[b] += p;
      }
    }
  }
  if (want_left) {
    std::vector<double> acc = tail_k;
    double total = 0;
    for (int t = len - 1; t >= 0; --t) {
      const int64_t row = ((first + t) * H + head) * K;
      const float *q = c.q.f32() + row, *dq = c.dq.f32() + row, *k = c.k.f32() + row,
                  *dk = c.dk.f32() + row;
      double sum = 0;
      for (int a = 0; a < K; ++a) {
        acc[a] += double{q[a]} * dq[a] - double{k[a]} * dk[a];
        sum += acc[a];
      }
      if (f.kind == DecayKind::kScalar)
        c.args.dg.f32()[(first + t) * H + head] = static_cast<float>(sum);
      if (f.kind == DecayKind::kVector || f.kind == DecayKind::kLeftRight) {
        float* dgk = c.args.dgk.f32() + row;
        for (int a = 0; a < K; ++a) dgk[a] = static_cast<float>(acc[a]);
      }
      total += sum;
    }
    if (f.kind == DecayKind::kConstant) c.log_gamma_partial[int64_t{seq} * H + head] = total;
  }
  if (want_right) {
    // The value side needs the outputs: recompute them from s0.
    std::vector<float> state(kv, 0.0f), o(static_cast<size_t>(len) * V);
    if (s0 != nullptr) std::copy(s0, s0 + kv, state.begin());
    ops.q = Rows(c.q, first, head, f.scale);
    ops.k = Rows(c.k, first, head);
    ops.v = Rows(c.v, first, head);
    ops.left = left;
    ops.right = right;
    ops.reverse = false;
    UlaPass(ops, c.form, chunk, state.data(), o.data(), V);
    std::vector<double> acc = tail_v;
    for (int t = len - 1; t >= 0; --t) {
      const int64_t row = ((first + t) * H + head) * V;
      const float *d_o = c.d_o.f32() + row, *v = c.v.f32() + row, *dv = c.dv.f32() + row;
      const float* o_t = o.data() + int64_t{t} * V;
      float* dgv = c.args.dgv.f32() + row;
      for (int b = 0; b < V; ++b) {
        acc[b] += double{o_t[b]} * d_o[b] - double{v[b]} * dv[b];
        dgv[b] = static_cast<float>(acc[b]);
      }
    }
  }
}

}  // namespace

absl::Status DecayForwardCpu(const SequenceBatch& batch, const DecayForwardArgs& args,
                             MixerForm form, int threads) {
  LAIR_RETURN_IF_ERROR(CheckDecayInputs(batch, args, /*distinct_slots=*/true));
  const int64_t n = args.q.dim(0);
  const int H = args.heads, K = args.key_dim, V = args.value_dim;
  LAIR_RETURN_IF_ERROR(CheckTensor(args.o, "o", {n, H, V}, Floats::kAny));

  const Tensor q = AsF32(args.q), k = AsF32(args.k), v = AsF32(args.v);
  const Tensor o = F32Target(args.o);
  const UlaForm ula_form = PickForm(batch, form);
  const int64_t kv = int64_t{K} * V;
  ParallelFor(int64_t{batch.num_seqs} * H, ThreadsFor(batch, args, threads), [&](int64_t item) {
    const int seq = static_cast<int>(item / H), head = static_cast<int>(item % H);
    const int64_t first = batch.cu_seqlens[seq];
    float* state = args.state.f32() + (int64_t{batch.state_slot[seq]} * H + head) * kv;
    if (batch.zero_initial_state) std::fill(state, state + kv, 0.0f);
    UlaOperands ops;
    ops.length = static_cast<int>(batch.cu_seqlens[seq + 1] - first);
    ops.q = Rows(q, first, head, args.scale);
    ops.k = Rows(k, first, head);
    ops.v = Rows(v, first, head);
    ops.left = LeftDecay(args, first, head, false);
    ops.right = RightDecay(args, first, head, false);
    UlaPass(ops, ula_form, args.chunk_size, state, o.f32() + (first * H + head) * V,
            int64_t{H} * V);
  });
  Commit(o, args.o);
  return absl::OkStatus();
}

absl::Status DecayBackwardCpu(const SequenceBatch& batch, const DecayBackwardArgs& args,
                              MixerForm form, int threads) {
  const DecayForwardArgs& f = args.fwd;
  LAIR_RETURN_IF_ERROR(CheckDecayInputs(batch, f, /*distinct_slots=*/false));
  const int64_t n = f.q.dim(0), seqs = batch.num_seqs;
  const int H = f.heads, K = f.key_dim, V = f.value_dim;
  LAIR_RETURN_IF_ERROR(CheckTensor(args.d_o, "d_o", {n, H, V}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckOptionalTensor(args.d_ht, "d_ht", {seqs, H, K, V}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dq, "dq", {n, H, K}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dk, "dk", {n, H, K}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dv, "dv", {n, H, V}, Floats::kAny));
  LAIR_RETURN_IF_ERROR(CheckOptionalTensor(args.d_log_gamma, "d_log_gamma", {H}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckOptionalTensor(args.dg, "dg", {n, H}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckOptionalTensor(args.dgk, "dgk", {n, H, K}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckOptionalTensor(args.dgv, "dgv", {n, H, V}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckOptionalTensor(args.dh0, "dh0", {seqs, H, K, V}, Floats::kF32));

  std::vector<double> log_gamma_partial(static_cast<size_t>(seqs) * H, 0.0);
  const BackwardContext context{batch,
                                args,
                                PickForm(batch, form),
                                AsF32(f.q),
                                AsF32(f.k),
                                AsF32(f.v),
                                AsF32(args.d_o),
                                F32Target(args.dq),
                                F32Target(args.dk),
                                F32Target(args.dv),
                                log_gamma_partial};
  ParallelFor(seqs * H, ThreadsFor(batch, f, threads), [&](int64_t item) {
    BackwardItem(context, static_cast<int>(item / H), static_cast<int>(item % H));
  });
  if (f.kind == DecayKind::kConstant && args.d_log_gamma.defined()) {
    for (int h = 0; h < H; ++h) {
      double sum = 0;
      for (int64_t s = 0; s < seqs; ++s) sum += log_gamma_partial[s * H + h];
      args.d_log_gamma.f32()[h] = static_cast<float>(sum);
    }
  }
  Commit(context.dq, args.dq);
  Commit(context.dk, args.dk);
  Commit(context.dv, args.dv);
  return absl::OkStatus();
}

}  // namespace lair::kernels::cpu
