#include "kernels/cpu/ula_core.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace lair::kernels::cpu {
namespace {

// Secondary chunk size of the vector-decay intra-chunk part (gla.md §5.4):
// the query rows that share one reference row for their rescaling.
constexpr int kSubChunk = 16;

// The operands of one pass copied into contiguous rows in iteration order
// (row i is token n-1-i when reversed), scales and decay shifts applied.
struct Gathered {
  int n = 0, dk = 0, dv = 0;
  std::vector<float> q, k, v;  // [n, dk], [n, dk], [n, dv]
  // Scalar form (no vector decay on either side): a[i] = ℓ_i + r_i; empty
  // when there is no decay at all.
  bool scalar = true;
  std::vector<float> a;  // [n]
  // Vector form: per-feature log-decays; empty on a side without decay.
  std::vector<float> l, r;  // [n, dk], [n, dv]
};

void GatherRows(const RowsView& view, int n, bool reverse, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(n) * view.dim);
  for (int i = 0; i < n; ++i) {
    const int t = reverse ? n - 1 - i : i;
    const float* src = view.base + t * view.stride;
    float* row = dst.data() + static_cast<int64_t>(i) * view.dim;
    if (view.scale == 1.0f) {
      std::copy(src, src + view.dim, row);
    } else {
      for (int c = 0; c < view.dim; ++c) row[c] = view.scale * src[c];
    }
  }
}

// The token whose decay token t uses, or -1 for none.
int DecaySource(const LogDecayView& decay, int n, int t) {
  if (!decay.shifted) return t;
  return t + 1 < n ? t + 1 : -1;
}

// Adds side `decay` into the scalar log-decays a (sized on first use).
void GatherScalarDecay(const LogDecayView& decay, int n, bool reverse, std::vector<float>& a) {
  if (decay.kind == LogDecayView::Kind::kNone) return;
  if (a.empty()) a.assign(n, 0.0f);
  for (int i = 0; i < n; ++i) {
    const int src = DecaySource(decay, n, reverse ? n - 1 - i : i);
    if (src >= 0) a[i] += decay.base[src * decay.stride];
  }
}

// Fills per-feature log-decays of width `dim` (a scalar decay broadcast).
void GatherVectorDecay(const LogDecayView& decay, int n, int dim, bool reverse,
                       std::vector<float>& dst) {
  if (decay.kind == LogDecayView::Kind::kNone) return;
  dst.assign(static_cast<size_t>(n) * dim, 0.0f);
  for (int i = 0; i < n; ++i) {
    const int src = DecaySource(decay, n, reverse ? n - 1 - i : i);
    if (src < 0) continue;
    float* row = dst.data() + static_cast<int64_t>(i) * dim;
    if (decay.kind == LogDecayView::Kind::kScalar) {
      std::fill(row, row + dim, decay.base[src * decay.stride]);
    } else {
      const float* from = decay.base + src * decay.stride;
      std::copy(from, from + dim, row);
    }
  }
}

Gathered Gather(const UlaOperands& ops) {
  Gathered g;
  g.n = ops.length;
  g.dk = ops.q.dim;
  g.dv = ops.v.dim;
  GatherRows(ops.q, g.n, ops.reverse, g.q);
  GatherRows(ops.k, g.n, ops.reverse, g.k);
  GatherRows(ops.v, g.n, ops.reverse, g.v);
  g.scalar =
      ops.left.kind != LogDecayView::Kind::kVector && ops.right.kind != LogDecayView::Kind::kVector;
  if (g.scalar) {
    GatherScalarDecay(ops.left, g.n, ops.reverse, g.a);
    GatherScalarDecay(ops.right, g.n, ops.reverse, g.a);
  } else {
    GatherVectorDecay(ops.left, g.n, g.dk, ops.reverse, g.l);
    GatherVectorDecay(ops.right, g.n, g.dv, ops.reverse, g.r);
  }
  return g;
}

// ---------------------------------------------------------------------------
// Recurrent form: one rank-1 update and one vector-matrix product per token.
//   S = diag(λ_i) S diag(γ_i) + k_i v_iᵀ ;  o_i = Sᵀ q_i
void RecurrentPass(const Gathered& g, float* S, float* O) {
  const int dk = g.dk, dv = g.dv;
  std::vector<float> lam(dk, 1.0f), gam(dv, 1.0f);
  for (int i = 0; i < g.n; ++i) {
    const float* q = g.q.data() + static_cast<int64_t>(i) * dk;
    const float* k = g.k.data() + static_cast<int64_t>(i) * dk;
    const float* v = g.v.data() + static_cast<int64_t>(i) * dv;
    float* o = O + static_cast<int64_t>(i) * dv;
    if (g.scalar) {
      std::fill(lam.begin(), lam.end(), g.a.empty() ? 1.0f : std::exp(g.a[i]));
    } else {
      for (int c = 0; c < dk; ++c) lam[c] = g.l.empty() ? 1.0f : std::exp(g.l[i * int64_t{dk} + c]);
      for (int c = 0; c < dv; ++c) gam[c] = g.r.empty() ? 1.0f : std::exp(g.r[i * int64_t{dv} + c]);
    }
    std::fill(o, o + dv, 0.0f);
    for (int a = 0; a < dk; ++a) {
      float* row = S + static_cast<int64_t>(a) * dv;
      const float la = lam[a], ka = k[a], qa = q[a];
      for (int b = 0; b < dv; ++b) {
        row[b] = la * gam[b] * row[b] + ka * v[b];
        o[b] += qa * row[b];
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Chunked form. Per chunk of `len` rows starting at row c0, with the state S
// entering the chunk (§1.5.2, errata U2/U3 applied):
//   O_chunk = ((Q̄ K̄ᵀ) ⊙ M) V̄ ⊙ Υ   (intra)   +   (Q ⊙ Π) S ⊙ Υ   (inter)
//   S       = diag(Π_last) S diag(Υ_last) + (K ⊙ Π_last/Π)ᵀ (V ⊙ Υ_last/Υ)
// with Π, Υ the chunk-local inclusive products of the decays; the intra term
// is formed without ever dividing by Π or Υ (see the header).

// Largest log-decay span (natural log) a sub-chunk may have for its diagonal
// block to go through BLAS with factors up to e^kMaxSpan (far from the fp32
// limit e^88); a steeper sub-chunk takes the running-product path.
constexpr double kMaxSpan = 40.0;

// Rows of a chunk operand rescaled relative to a reference row r of the
// chunk: row j holds src_j ⊙ exp(cum_r − cum_j), with cum the chunk-local
// cumulative log-decays. Moving the reference forward multiplies the rows
// already held by exp(cum_new − cum_old) ≤ 1, so each row is exponentiated
// once however often the reference moves.
class RelativeRows {
 public:
  // `cum` and `buffer` have room for a chunk of `dim`-wide rows.
  RelativeRows(int dim, const std::vector<double>& cum, std::vector<float>& buffer)
      : dim_(dim), cum_(cum), buffer_(buffer), factor_(dim) {}

  // Starts a chunk whose rows are at `src`.
  void Reset(const float* src) {
    src_ = src;
    ready_ = 0;
    ref_ = 0;
  }

  // Makes rows [0, upto) relative to row `ref` (REQUIRES: ref never moves
  // back). Rows past `ref` get factors ≥ 1: the caller bounds them.
  void MoveTo(int ref, int upto) {
    if (ref != ref_ && ready_ > 0) {
      for (int c = 0; c < dim_; ++c)
        factor_[c] = std::exp(static_cast<float>(Cum(ref, c) - Cum(ref_, c)));
      for (int j = 0; j < ready_; ++j) {
        float* row = buffer_.data() + static_cast<int64_t>(j) * dim_;
        for (int c = 0; c < dim_; ++c) row[c] *= factor_[c];
      }
    }
    for (int j = ready_; j < upto; ++j) {
      const float* from = src_ + static_cast<int64_t>(j) * dim_;
      float* row = buffer_.data() + static_cast<int64_t>(j) * dim_;
      for (int c = 0; c < dim_; ++c)
        row[c] = from[c] * std::exp(static_cast<float>(Cum(ref, c) - Cum(j, c)));
    }
    ready_ = std::max(ready_, upto);
    ref_ = ref;
  }

  const float* rows() const { return buffer_.data(); }

 private:
  double Cum(int row, int c) const { return cum_[static_cast<int64_t>(row) * dim_ + c]; }

  const int dim_;
  const std::vector<double>& cum_;
  std::vector<float>& buffer_;
  std::vector<float> factor_;
  const float* src_ = nullptr;
  int ready_ = 0;  // rows [0, ready_) are relative to ref_
  int ref_ = 0;
};

class ChunkedPass {
 public:
  ChunkedPass(const Gathered& g, int chunk_size)
      : g_(g),
        dk_(g.dk),
        dv_(g.dv),
        c_(std::max(1, std::min(chunk_size, std::max(g.n, 1)))),
        bl_(static_cast<size_t>(c_) * dk_),
        br_(static_cast<size_t>(c_) * dv_),
        kb_(static_cast<size_t>(c_) * dk_),
        vb_(static_cast<size_t>(c_) * dv_),
        krel_(dk_, bl_, kb_),
        vrel_(dv_, br_, vb_) {
    qb_.resize(static_cast<size_t>(c_) * dk_);
    qs_.resize(static_cast<size_t>(c_) * dk_);
    a_.resize(static_cast<size_t>(c_) * c_);
    p_.resize(static_cast<size_t>(c_) * dv_);
    row_.resize(std::max(dk_, dv_));
    lam_.resize(static_cast<size_t>(kSubChunk) * dk_);
    gam_.resize(static_cast<size_t>(kSubChunk) * dv_);
    wk_.resize(dk_);
    wv_.resize(dv_);
  }

  void Run(float* S, float* O) {
    for (int c0 = 0; c0 < g_.n; c0 += c_) {
      const int len = std::min(c_, g_.n - c0);
      if (g_.scalar) {
        ScalarChunk(c0, len, S, O + static_cast<int64_t>(c0) * dv_);
      } else {
        VectorChunk(c0, len, S, O + static_cast<int64_t>(c0) * dv_);
      }
    }
  }

 private:
  const float* Q(int c0) const { return g_.q.data() + static_cast<int64_t>(c0) * dk_; }
  const float* K(int c0) const { return g_.k.data() + static_cast<int64_t>(c0) * dk_; }
  const float* V(int c0) const { return g_.v.data() + static_cast<int64_t>(c0) * dv_; }

  // Scalar decay: b_i = Σ_{u ≤ i} a_u inside the chunk; the decay between
  // rows j ≤ i is exp(b_i − b_j), formed directly (mask before exp).
  void ScalarChunk(int c0, int len, float* S, float* O) {
    const bool decays = !g_.a.empty();
    double run = 0;
    for (int i = 0; i < len; ++i) {
      run += decays ? g_.a[c0 + i] : 0.0f;
      bl_[i] = run;
    }
    const double b_last = bl_[len - 1];

    // Inter: O = diag(exp b) Q S.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, len, dv_, dk_, 1.0f, Q(c0), dk_, S, dv_,
                0.0f, O, dv_);
    if (decays) {
      for (int i = 0; i < len; ++i) {
        const float f = std::exp(static_cast<float>(bl_[i]));
        for (int b = 0; b < dv_; ++b) O[i * dv_ + b] *= f;
      }
    }
    // Intra: O += ((Q Kᵀ) ⊙ D) V, D_ij = exp(b_i − b_j) for j ≤ i, else 0.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, len, len, dk_, 1.0f, Q(c0), dk_, K(c0),
                dk_, 0.0f, a_.data(), len);
    for (int i = 0; i < len; ++i) {
      float* row = a_.data() + static_cast<int64_t>(i) * len;
      for (int j = 0; j < len; ++j) {
        if (j > i) {
          row[j] = 0.0f;
        } else if (decays) {
          row[j] *= std::exp(static_cast<float>(bl_[i] - bl_[j]));
        }
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, len, dv_, len, 1.0f, a_.data(), len,
                V(c0), dv_, 1.0f, O, dv_);
    // State: S = exp(b_last) S + (K ⊙ exp(b_last − b))ᵀ V.
    const float* kt = K(c0);
    if (decays) {
      for (int j = 0; j < len; ++j) {
        const float f = std::exp(static_cast<float>(b_last - bl_[j]));
        for (int c = 0; c < dk_; ++c) kb_[j * dk_ + c] = f * K(c0)[j * dk_ + c];
      }
      const float f = std::exp(static_cast<float>(b_last));
      for (int64_t e = 0; e < static_cast<int64_t>(dk_) * dv_; ++e) S[e] *= f;
      kt = kb_.data();
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dk_, dv_, len, 1.0f, kt, dk_, V(c0), dv_,
                1.0f, S, dv_);
  }

  // Chunk-local inclusive cumulative sums (double) of per-feature decays.
  void CumSum(const std::vector<float>& logs, int c0, int len, int dim, std::vector<double>& out) {
    for (int c = 0; c < dim; ++c) out[c] = logs[static_cast<int64_t>(c0) * dim + c];
    for (int i = 1; i < len; ++i) {
      const float* row = logs.data() + static_cast<int64_t>(c0 + i) * dim;
      for (int c = 0; c < dim; ++c) out[i * dim + c] = out[(i - 1) * dim + c] + row[c];
    }
  }

  // max over features of cum_from − cum_to (the steepest decay in between).
  static double Span(const std::vector<double>& cum, int dim, int from, int to) {
    double span = 0;
    for (int c = 0; c < dim; ++c) span = std::max(span, cum[from * dim + c] - cum[to * dim + c]);
    return span;
  }

  // Vector decays, secondary chunking (gla.md §5.4). Every query sub-chunk
  // [s0, s1) works relative to its first row s0:
  //   Q_r = Q ⊙ exp(bl_i − bl_s0),  K_r = K ⊙ exp(bl_s0 − bl_j),  V_r = V ⊙ exp(br_s0 − br_j)
  //   O_i = exp(br_i − br_s0) ⊙ [ (Q_r ⊙ exp(bl_s0)) S ⊙ exp(br_s0)  +  ((Q_r K_rᵀ) ⊙ M) V_r ]
  // For keys before s0 all factors are ≤ 1. Inside the sub-chunk K_r and V_r
  // grow up to e^span, so the diagonal block joins the matmul only when the
  // span is at most kMaxSpan; otherwise it is accumulated with running
  // products of per-step decays ≤ 1 instead, after the rescaling.
  void VectorChunk(int c0, int len, float* S, float* O) {
    const bool left = !g_.l.empty(), right = !g_.r.empty();
    const float* q = Q(c0);
    const float* k = K(c0);
    const float* v = V(c0);
    if (left) {
      CumSum(g_.l, c0, len, dk_, bl_);
      krel_.Reset(k);
    }
    if (right) {
      CumSum(g_.r, c0, len, dv_, br_);
      vrel_.Reset(v);
    }
    for (int s0 = 0; s0 < len; s0 += kSubChunk) {
      const int s1 = std::min(s0 + kSubChunk, len), m = s1 - s0;
      const bool fast = (!left || Span(bl_, dk_, s0, s1 - 1) <= kMaxSpan) &&
                        (!right || Span(br_, dv_, s0, s1 - 1) <= kMaxSpan);
      const int keys = fast ? s1 : s0;  // key rows that go through the matmul
      const float* kr = k;
      const float* vr = v;
      if (left) {
        krel_.MoveTo(s0, keys);
        kr = krel_.rows();
      }
      if (right) {
        vrel_.MoveTo(s0, keys);
        vr = vrel_.rows();
      }

      // Queries relative to s0, and the inter term (Q_r ⊙ exp(bl_s0)) S.
      const float* qr = q + static_cast<int64_t>(s0) * dk_;
      if (left) {
        for (int c = 0; c < dk_; ++c) row_[c] = std::exp(static_cast<float>(bl_[s0 * dk_ + c]));
        for (int i = s0; i < s1; ++i) {
          for (int c = 0; c < dk_; ++c) {
            const float rel = std::exp(static_cast<float>(bl_[i * dk_ + c] - bl_[s0 * dk_ + c]));
            qb_[(i - s0) * dk_ + c] = q[i * dk_ + c] * rel;
            qs_[(i - s0) * dk_ + c] = qb_[(i - s0) * dk_ + c] * row_[c];
          }
        }
        qr = qb_.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv_, dk_, 1.0f,
                  left ? qs_.data() : qr, dk_, S, dv_, 0.0f, p_.data(), dv_);
      if (right) {
        for (int c = 0; c < dv_; ++c) row_[c] = std::exp(static_cast<float>(br_[s0 * dv_ + c]));
        for (int i = 0; i < m; ++i) {
          for (int c = 0; c < dv_; ++c) p_[i * dv_ + c] *= row_[c];
        }
      }

      // Intra: ((Q_r K_rᵀ) ⊙ M) V_r over the keys that go through BLAS.
      if (keys > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, keys, dk_, 1.0f, qr, dk_, kr, dk_,
                    0.0f, a_.data(), keys);
        if (fast) {
          for (int i = 0; i < m; ++i) {
            for (int j = s0 + i + 1; j < s1; ++j) a_[i * keys + j] = 0.0f;
          }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv_, keys, 1.0f, a_.data(), keys,
                    vr, dv_, 1.0f, p_.data(), dv_);
      }

      // Back from s0-relative value units: O_i = P_i ⊙ exp(br_i − br_s0).
      float* o = O + static_cast<int64_t>(s0) * dv_;
      for (int i = 0; i < m; ++i) {
        for (int c = 0; c < dv_; ++c) {
          o[i * dv_ + c] =
              right ? p_[i * dv_ + c] *
                          std::exp(static_cast<float>(br_[(s0 + i) * dv_ + c] - br_[s0 * dv_ + c]))
                    : p_[i * dv_ + c];
        }
      }
      if (!fast) SteepDiagonal(c0, s0, s1, O);
    }

    // State: S = diag(Π_last) S diag(Υ_last) + (K ⊙ Π_last/Π)ᵀ (V ⊙ Υ_last/Υ).
    const int last = len - 1;
    const float* kt = k;
    const float* vt = v;
    if (left) {
      krel_.MoveTo(last, len);
      kt = krel_.rows();
      for (int a = 0; a < dk_; ++a) {
        const float f = std::exp(static_cast<float>(bl_[last * dk_ + a]));
        for (int b = 0; b < dv_; ++b) S[a * dv_ + b] *= f;
      }
    }
    if (right) {
      vrel_.MoveTo(last, len);
      vt = vrel_.rows();
      for (int b = 0; b < dv_; ++b) row_[b] = std::exp(static_cast<float>(br_[last * dv_ + b]));
      for (int a = 0; a < dk_; ++a) {
        for (int b = 0; b < dv_; ++b) S[a * dv_ + b] *= row_[b];
      }
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dk_, dv_, len, 1.0f, kt, dk_, vt, dv_,
                1.0f, S, dv_);
  }

  // The diagonal block of a steep sub-chunk [s0, s1): for j ≤ i the decays
  // Π_{u=j+1..i} λ_u and γ_u are running products of per-step factors ≤ 1:
  //   o_i += (q_i · (k_j ⊙ Πλ)) (v_j ⊙ Πγ).
  void SteepDiagonal(int c0, int s0, int s1, float* O) {
    const bool left = !g_.l.empty(), right = !g_.r.empty();
    const float* q = Q(c0);
    const float* k = K(c0);
    const float* v = V(c0);
    const int64_t first = static_cast<int64_t>(c0) + s0, m = s1 - s0;
    for (int64_t e = 0; left && e < m * dk_; ++e) lam_[e] = std::exp(g_.l[first * dk_ + e]);
    for (int64_t e = 0; right && e < m * dv_; ++e) gam_[e] = std::exp(g_.r[first * dv_ + e]);
    for (int j = s0; j < s1; ++j) {
      std::copy(k + j * dk_, k + (j + 1) * dk_, wk_.begin());
      std::copy(v + j * dv_, v + (j + 1) * dv_, wv_.begin());
      for (int i = j; i < s1; ++i) {
        if (i > j && left) {
          for (int c = 0; c < dk_; ++c) wk_[c] *= lam_[(i - s0) * dk_ + c];
        }
        if (i > j && right) {
          for (int c = 0; c < dv_; ++c) wv_[c] *= gam_[(i - s0) * dv_ + c];
        }
        float dot = 0.0f;
        for (int c = 0; c < dk_; ++c) dot += q[i * dk_ + c] * wk_[c];
        float* o = O + static_cast<int64_t>(i) * dv_;
        for (int c = 0; c < dv_; ++c) o[c] += dot * wv_[c];
      }
    }
  }

  const Gathered& g_;
  const int dk_, dv_, c_;
  // Chunk-local cumulative log-decays (double), the key and value rows
  // relative to a reference row, and chunk-sized scratch: queries relative to
  // the sub-chunk (qb_) and to the chunk start (qs_), a score block, a
  // product block, one row, and the per-step decays and running products of
  // steep diagonal blocks.
  std::vector<double> bl_, br_;
  std::vector<float> kb_, vb_;
  RelativeRows krel_, vrel_;
  std::vector<float> qb_, qs_, a_, p_, row_, lam_, gam_, wk_, wv_;
};

}  // namespace

void UlaPass(const UlaOperands& ops, UlaForm form, int chunk_size, float* state, float* out,
             int64_t out_stride) {
  const Gathered g = Gather(ops);
  std::vector<float> o(static_cast<size_t>(g.n) * g.dv);
  if (form == UlaForm::kRecurrent) {
    RecurrentPass(g, state, o.data());
  } else {
    ChunkedPass(g, chunk_size).Run(state, o.data());
  }
  for (int i = 0; i < g.n; ++i) {
    const int t = ops.reverse ? g.n - 1 - i : i;
    std::copy(o.begin() + static_cast<int64_t>(i) * g.dv,
              o.begin() + static_cast<int64_t>(i + 1) * g.dv, out + t * out_stride);
  }
}

}  // namespace lair::kernels::cpu
