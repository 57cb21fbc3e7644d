// mLSTM CPU kernels: the golden fixtures, a float64 recurrent oracle, the
// agreement of the recurrent, chunked and one-token forms, prefill split at
// arbitrary points, packed batches, gradients against finite differences and
// extreme gates.
#include "kernels/cpu/mlstm.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "tests/kernels/mixer_test_support.h"
#include "tests/support/fixtures.h"

namespace lair::kernels::cpu {
namespace {

using mixer_test::Dot;
using mixer_test::FillNormal;
using mixer_test::FiniteDifference;
using mixer_test::GatherRows;
using mixer_test::MakePiece;
using mixer_test::Offsets;
using mixer_test::PackSequences;
using mixer_test::Piece;
using mixer_test::RelativeErrorTo;
using mixer_test::ScatterRows;
using mixer_test::StepCuts;
using mixer_test::ToDouble;

// Everything one mLSTM launch reads, with one initial state per sequence.
struct Inputs {
  MlstmKind kind = MlstmKind::kExp;
  int heads = 0, key_dim = 0, value_dim = 0;
  float eps = 1e-6f;
  std::vector<int> lens;
  Tensor q, k, v, i, f;  // packed [N,H,K], [N,H,K], [N,H,V], [N,H], [N,H]
  Tensor c0, n0, m0;     // [S,H,K,V], [S,H,K], [S,H]

  int64_t tokens() const { return q.dim(0); }
  int seqs() const { return static_cast<int>(lens.size()); }
};

struct Outputs {
  Tensor h;        // [N,H,V]
  Tensor c, n, m;  // final states [S,...]
};

struct Grads {
  Tensor dq, dk, dv, di, df, dc0, dn0;
};

Inputs MakeInputs(MlstmKind kind, int heads, int key_dim, int value_dim, std::vector<int> lens,
                  uint32_t seed, float i_mean = 0.0f, float f_mean = 2.0f) {
  std::mt19937 rng(seed);
  Inputs in;
  in.kind = kind;
  in.heads = heads;
  in.key_dim = key_dim;
  in.value_dim = value_dim;
  in.lens = std::move(lens);
  const int64_t n = Offsets(in.lens).back(), s = in.seqs();
  in.q = Tensor::Zeros(DType::kF32, {n, heads, key_dim});
  in.k = Tensor::Zeros(DType::kF32, {n, heads, key_dim});
  in.v = Tensor::Zeros(DType::kF32, {n, heads, value_dim});
  in.i = Tensor::Zeros(DType::kF32, {n, heads});
  in.f = Tensor::Zeros(DType::kF32, {n, heads});
  in.c0 = Tensor::Zeros(DType::kF32, {s, heads, key_dim, value_dim});
  in.n0 = Tensor::Zeros(DType::kF32, {s, heads, key_dim});
  in.m0 = Tensor::Zeros(DType::kF32, {s, heads});
  FillNormal(in.q, rng, 0, 1);
  FillNormal(in.k, rng, 0, 1);
  FillNormal(in.v, rng, 0, 1);
  FillNormal(in.i, rng, i_mean, 1);
  FillNormal(in.f, rng, f_mean, 1);
  FillNormal(in.c0, rng, 0, 0.5f);
  FillNormal(in.n0, rng, 0, 0.5f);
  if (kind == MlstmKind::kExp) FillNormal(in.m0, rng, 0, 1);
  return in;
}

// State pools with the sequences in reverse slot order and one spare slot, so
// every run also checks the slot indirection.
struct Pools {
  Tensor c, n, m;
  std::vector<int32_t> slot;  // per sequence
};

Pools MakePools(const Inputs& in) {
  const int64_t s = in.seqs(), slots = s + 1;
  Pools p;
  p.c = Tensor::Zeros(DType::kF32, {slots, in.heads, in.key_dim, in.value_dim});
  p.n = Tensor::Zeros(DType::kF32, {slots, in.heads, in.key_dim});
  p.m = Tensor::Zeros(DType::kF32, {slots, in.heads});
  for (int64_t seq = 0; seq < s; ++seq) {
    const int32_t slot = static_cast<int32_t>(s - seq);
    p.slot.push_back(slot);
    std::copy_n(in.c0.f32() + seq * in.heads * in.key_dim * in.value_dim,
                in.heads * in.key_dim * in.value_dim,
                p.c.f32() + slot * in.heads * in.key_dim * in.value_dim);
    std::copy_n(in.n0.f32() + seq * in.heads * in.key_dim, in.heads * in.key_dim,
                p.n.f32() + slot * in.heads * in.key_dim);
    std::copy_n(in.m0.f32() + seq * in.heads, in.heads, p.m.f32() + slot * in.heads);
  }
  return p;
}

MlstmForwardArgs ArgsFor(const Inputs& in, int chunk) {
  MlstmForwardArgs args;
  args.kind = in.kind;
  args.heads = in.heads;
  args.key_dim = in.key_dim;
  args.value_dim = in.value_dim;
  args.eps = in.eps;
  args.chunk_size = chunk;
  return args;
}

// The forward over all of `in` at once, states in `pools`.
MlstmForwardArgs WholeArgs(const Inputs& in, const Pools& pools, int chunk) {
  MlstmForwardArgs args = ArgsFor(in, chunk);
  args.q = in.q;
  args.k = in.k;
  args.v = in.v;
  args.i = in.i;
  args.f = in.f;
  args.h = Tensor::Zeros(DType::kF32, in.v.shape());
  args.state_c = pools.c;
  args.state_n = pools.n;
  args.state_m = pools.m;
  return args;
}

// Runs the forward in pieces: piece p covers tokens [cuts[p], cuts[p+1]) of
// every sequence (clamped to its length), the state carried in the pools.
Outputs RunPieces(const Inputs& in, MixerForm form, int chunk, const std::vector<int>& cuts) {
  Pools pools = MakePools(in);
  Outputs out;
  out.h = Tensor::Zeros(DType::kF32, {in.tokens(), in.heads, in.value_dim});
  for (size_t p = 0; p + 1 < cuts.size(); ++p) {
    const Piece piece = MakePiece(in.lens, pools.slot, cuts[p], cuts[p + 1]);
    if (piece.empty()) continue;
    MlstmForwardArgs args = ArgsFor(in, chunk);
    args.q = GatherRows(in.q, piece.rows);
    args.k = GatherRows(in.k, piece.rows);
    args.v = GatherRows(in.v, piece.rows);
    args.i = GatherRows(in.i, piece.rows);
    args.f = GatherRows(in.f, piece.rows);
    args.h = Tensor::Zeros(DType::kF32,
                           {static_cast<int64_t>(piece.rows.size()), in.heads, in.value_dim});
    args.state_c = pools.c;
    args.state_n = pools.n;
    args.state_m = pools.m;
    EXPECT_TRUE(MlstmForwardCpu(piece.Batch(), args, form).ok());
    ScatterRows(args.h, piece.rows, out.h);
  }
  std::vector<int64_t> slots(pools.slot.begin(), pools.slot.end());
  out.c = GatherRows(pools.c, slots);
  out.n = GatherRows(pools.n, slots);
  out.m = GatherRows(pools.m, slots);
  return out;
}

Outputs RunOnce(const Inputs& in, MixerForm form, int chunk) {
  return RunPieces(in, form, chunk, {0, 1 << 30});
}

// One token of every sequence per call: the decode step.
Outputs RunStepwise(const Inputs& in) {
  return RunPieces(in, MixerForm::kAuto, 64, StepCuts(in.lens));
}

struct Cotangents {
  Tensor dh, dct, dnt;
};

Cotangents MakeCotangents(const Inputs& in, uint32_t seed) {
  std::mt19937 rng(seed);
  Cotangents d;
  d.dh = Tensor::Zeros(DType::kF32, {in.tokens(), in.heads, in.value_dim});
  d.dct = Tensor::Zeros(DType::kF32, in.c0.shape());
  d.dnt = Tensor::Zeros(DType::kF32, in.n0.shape());
  FillNormal(d.dh, rng, 0, 1);
  FillNormal(d.dct, rng, 0, 1);
  FillNormal(d.dnt, rng, 0, 1);
  return d;
}

Grads RunBackward(const Inputs& in, const Cotangents& d, int chunk) {
  Pools pools = MakePools(in);
  const std::vector<int32_t> cu = Offsets(in.lens);
  MlstmBackwardArgs args;
  args.fwd = WholeArgs(in, pools, chunk);
  args.d_h = d.dh;
  args.d_ct = d.dct;
  args.d_nt = d.dnt;
  Grads g;
  g.dq = args.dq = Tensor::Zeros(DType::kF32, in.q.shape());
  g.dk = args.dk = Tensor::Zeros(DType::kF32, in.k.shape());
  g.dv = args.dv = Tensor::Zeros(DType::kF32, in.v.shape());
  g.di = args.di = Tensor::Zeros(DType::kF32, in.i.shape());
  g.df = args.df = Tensor::Zeros(DType::kF32, in.f.shape());
  g.dc0 = args.d_c0 = Tensor::Zeros(DType::kF32, in.c0.shape());
  g.dn0 = args.d_n0 = Tensor::Zeros(DType::kF32, in.n0.shape());
  const Tensor pool_before = pools.c.Clone();
  SequenceBatch batch;
  batch.num_seqs = in.seqs();
  batch.cu_seqlens = cu;
  batch.state_slot = pools.slot;
  EXPECT_TRUE(MlstmBackwardCpu(batch, args).ok());
  EXPECT_EQ(RelativeError(pools.c, pool_before), 0.0) << "the backward wrote the pool";
  return g;
}

// ---------------------------------------------------------------------------
// Float64 oracle: the recurrence of specs/mlstm.md §1.2 / §1.3, written out
// per token, and the loss the fixtures differentiate.

struct Oracle {
  std::vector<double> h, c, n, m;  // packed outputs and final states, layouts as the tensors
  std::vector<double> norm_dot;    // q'ᵀn_t, packed [N,H]
};

struct DoubleInputs {
  std::vector<double> q, k, v, i, f, c0, n0, m0;
  explicit DoubleInputs(const Inputs& in)
      : q(ToDouble(in.q)),
        k(ToDouble(in.k)),
        v(ToDouble(in.v)),
        i(ToDouble(in.i)),
        f(ToDouble(in.f)),
        c0(ToDouble(in.c0)),
        n0(ToDouble(in.n0)),
        m0(ToDouble(in.m0)) {}
};

double LogSigmoid64(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }

Oracle RunOracle(const Inputs& in, const DoubleInputs& x) {
  const int H = in.heads, K = in.key_dim, V = in.value_dim;
  const std::vector<int32_t> cu = Offsets(in.lens);
  Oracle o;
  o.h.assign(in.tokens() * H * V, 0.0);
  o.norm_dot.assign(in.tokens() * H, 0.0);
  o.c = x.c0;
  o.n = x.n0;
  o.m = in.kind == MlstmKind::kExp ? x.m0 : std::vector<double>(x.m0.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  for (int s = 0; s < in.seqs(); ++s) {
    for (int h = 0; h < H; ++h) {
      double* c = &o.c[(s * H + h) * K * V];
      double* n = &o.n[(s * H + h) * K];
      double& m = o.m[s * H + h];
      for (int t = cu[s]; t < cu[s + 1]; ++t) {
        const double lf = LogSigmoid64(x.f[t * H + h]), it = x.i[t * H + h];
        double fa, ia;
        if (in.kind == MlstmKind::kExp) {
          const double m_new = std::max(lf + m, it);
          fa = std::exp(lf + m - m_new);
          ia = std::exp(it - m_new);
          m = m_new;
        } else {
          fa = std::exp(lf);
          ia = std::exp(LogSigmoid64(it));
        }
        const double* kt = &x.k[(t * H + h) * K];
        const double* vt = &x.v[(t * H + h) * V];
        const double* qt = &x.q[(t * H + h) * K];
        for (int a = 0; a < K; ++a) {
          for (int b = 0; b < V; ++b) c[a * V + b] = fa * c[a * V + b] + ia * kt[a] * vt[b];
          n[a] = fa * n[a] + ia * kt[a];
        }
        double qn = 0;
        for (int a = 0; a < K; ++a) qn += scale * qt[a] * n[a];
        o.norm_dot[t * H + h] = qn;
        double den = 1.0;
        if (in.kind == MlstmKind::kExp) den = std::max(std::fabs(qn), std::exp(-m)) + in.eps;
        if (in.kind == MlstmKind::kSigNorm) den = std::max(std::fabs(qn), 1.0) + in.eps;
        for (int b = 0; b < V; ++b) {
          double num = 0;
          for (int a = 0; a < K; ++a) num += scale * qt[a] * c[a * V + b];
          o.h[(t * H + h) * V + b] = num / den;
        }
      }
    }
  }
  return o;
}

double Loss(const Inputs& in, const DoubleInputs& x, const Cotangents& d) {
  const Oracle o = RunOracle(in, x);
  return Dot(o.h, d.dh) + Dot(o.c, d.dct) + Dot(o.n, d.dnt);
}

bool AllFinite(const Tensor& t) {
  return std::all_of(t.f32(), t.f32() + t.numel(), [](float x) { return std::isfinite(x); });
}

const MlstmKind kKinds[] = {MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm};

std::string KindName(MlstmKind kind) {
  switch (kind) {
    case MlstmKind::kExp:
      return "exp";
    case MlstmKind::kSig:
      return "sig";
    case MlstmKind::kSigNorm:
      return "sig_norm";
  }
  return "?";
}

void ExpectOutputsNear(const Outputs& a, const Outputs& b, double tol, const std::string& what) {
  EXPECT_LE(RelativeError(a.h, b.h), tol) << what << ": h";
  EXPECT_LE(RelativeError(a.c, b.c), tol) << what << ": C";
  EXPECT_LE(RelativeError(a.n, b.n), tol) << what << ": n";
  EXPECT_LE(RelativeError(a.m, b.m), tol) << what << ": m";
}

// ---------------------------------------------------------------------------

TEST(MlstmCpuTest, OracleAgreesWithEveryForm) {
  for (MlstmKind kind : kKinds) {
    const Inputs in = MakeInputs(kind, 2, 16, 8, {1, 7, 37, 64, 65, 130}, 11);
    const Oracle ref = RunOracle(in, DoubleInputs(in));
    const Outputs recurrent = RunOnce(in, MixerForm::kRecurrent, 64);
    EXPECT_LE(RelativeErrorTo(recurrent.h, ref.h), 1e-5) << KindName(kind);
    EXPECT_LE(RelativeErrorTo(recurrent.c, ref.c), 1e-5) << KindName(kind);
    EXPECT_LE(RelativeErrorTo(recurrent.n, ref.n), 1e-5) << KindName(kind);
    for (int chunk : {1, 3, 16, 64, 200}) {
      ExpectOutputsNear(RunOnce(in, MixerForm::kChunked, chunk), recurrent, 1e-5,
                        KindName(kind) + " chunk " + std::to_string(chunk));
    }
    ExpectOutputsNear(RunOnce(in, MixerForm::kAuto, 16), recurrent, 1e-5, KindName(kind) + " auto");
    ExpectOutputsNear(RunStepwise(in), recurrent, 1e-5, KindName(kind) + " stepwise");
  }
}

// A training forward's q'ᵀn (MlstmForwardArgs::norm_dot), in the recurrent
// and chunked forms, against the oracle's; the sig kind has none.
TEST(MlstmCpuTest, NormDotMatchesTheOracle) {
  for (MlstmKind kind : kKinds) {
    const Inputs in = MakeInputs(kind, 2, 16, 8, {1, 7, 37, 64, 65, 130}, 13);
    const Oracle ref = RunOracle(in, DoubleInputs(in));
    for (const auto& [form, chunk] :
         {std::pair{MixerForm::kRecurrent, 64}, std::pair{MixerForm::kChunked, 16},
          std::pair{MixerForm::kChunked, 64}}) {
      const std::string what = KindName(kind) + " chunk " + std::to_string(chunk);
      Pools pools = MakePools(in);
      MlstmForwardArgs args = WholeArgs(in, pools, chunk);
      args.norm_dot = Tensor::Zeros(DType::kF32, {in.tokens(), in.heads});
      const std::vector<int32_t> cu = Offsets(in.lens);
      SequenceBatch batch;
      batch.num_seqs = in.seqs();
      batch.cu_seqlens = cu;
      batch.state_slot = pools.slot;
      const absl::Status st = MlstmForwardCpu(batch, args, form);
      if (kind == MlstmKind::kSig) {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what;
        EXPECT_NE(st.message().find("norm_dot"), std::string::npos) << what << ": " << st;
        continue;
      }
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      EXPECT_LE(RelativeErrorTo(args.norm_dot, ref.norm_dot), 1e-5) << what;
    }
  }
}

TEST(MlstmCpuTest, SplitPrefillMatchesOnePass) {
  for (MlstmKind kind : kKinds) {
    const Inputs in = MakeInputs(kind, 2, 8, 8, {100, 37, 16}, 12);
    const Outputs whole = RunOnce(in, MixerForm::kChunked, 16);
    for (int cut : {1, 15, 16, 17, 50}) {
      ExpectOutputsNear(RunPieces(in, MixerForm::kChunked, 16, {0, cut, 1 << 30}), whole, 1e-5,
                        KindName(kind) + " cut " + std::to_string(cut));
    }
    // Chunked prefill of 40 tokens, then one token per call.
    std::vector<int> cuts = {0};
    for (int t = 40; t <= 100; ++t) cuts.push_back(t);
    ExpectOutputsNear(RunPieces(in, MixerForm::kAuto, 16, cuts), whole, 1e-5,
                      KindName(kind) + " prefill+decode");
  }
}

TEST(MlstmCpuTest, PackedMatchesSeparate) {
  for (MlstmKind kind : kKinds) {
    const Inputs in = MakeInputs(kind, 3, 8, 4, {5, 70, 0, 33}, 13);
    const Outputs packed = RunOnce(in, MixerForm::kChunked, 16);
    const std::vector<int32_t> cu = Offsets(in.lens);
    for (int s = 0; s < in.seqs(); ++s) {
      Inputs one = in;
      one.lens = {in.lens[s]};
      std::vector<int64_t> rows;
      for (int t = cu[s]; t < cu[s + 1]; ++t) rows.push_back(t);
      one.q = GatherRows(in.q, rows);
      one.k = GatherRows(in.k, rows);
      one.v = GatherRows(in.v, rows);
      one.i = GatherRows(in.i, rows);
      one.f = GatherRows(in.f, rows);
      one.c0 = GatherRows(in.c0, {s});
      one.n0 = GatherRows(in.n0, {s});
      one.m0 = GatherRows(in.m0, {s});
      const Outputs alone = RunOnce(one, MixerForm::kChunked, 16);
      Outputs part;
      part.h = GatherRows(packed.h, rows);
      part.c = GatherRows(packed.c, {s});
      part.n = GatherRows(packed.n, {s});
      part.m = GatherRows(packed.m, {s});
      ExpectOutputsNear(part, alone, 1e-6, KindName(kind) + " sequence " + std::to_string(s));
    }
  }
}

TEST(MlstmCpuTest, ZeroInitialStateIgnoresThePool) {
  for (MlstmKind kind : kKinds) {
    Inputs in = MakeInputs(kind, 2, 8, 8, {9, 20}, 14);
    Pools pools = MakePools(in);  // non-zero states that must be ignored
    const std::vector<int32_t> cu = Offsets(in.lens);
    MlstmForwardArgs args = WholeArgs(in, pools, 8);
    SequenceBatch batch;
    batch.num_seqs = in.seqs();
    batch.cu_seqlens = cu;
    batch.state_slot = pools.slot;
    batch.zero_initial_state = true;
    ASSERT_TRUE(MlstmForwardCpu(batch, args, MixerForm::kChunked).ok());
    in.c0 = Tensor::Zeros(DType::kF32, in.c0.shape());
    in.n0 = Tensor::Zeros(DType::kF32, in.n0.shape());
    in.m0 = Tensor::Zeros(DType::kF32, in.m0.shape());
    EXPECT_LE(RelativeError(args.h, RunOnce(in, MixerForm::kRecurrent, 8).h), 1e-5)
        << KindName(kind);
  }
}

TEST(MlstmCpuTest, GradientsMatchFiniteDifferences) {
  for (MlstmKind kind : kKinds) {
    // Large input gates make m follow i on some steps, so both branches of
    // the stabilizer max and of the denominator max are exercised.
    Inputs in = MakeInputs(kind, 2, 3, 2, {6, 1, 4}, 15, /*i_mean=*/1.0f, /*f_mean=*/0.5f);
    in.i.f32()[2] = 6.0f;
    const Cotangents d = MakeCotangents(in, 16);
    const DoubleInputs x(in);
    auto finite_difference = [&](std::vector<double> DoubleInputs::*field) {
      return FiniteDifference(x, field,
                              [&](const DoubleInputs& probe) { return Loss(in, probe, d); });
    };
    for (int chunk : {1, 4, 64}) {
      const Grads g = RunBackward(in, d, chunk);
      const std::string what = KindName(kind) + " chunk " + std::to_string(chunk);
      EXPECT_LE(RelativeErrorTo(g.dq, finite_difference(&DoubleInputs::q)), 1e-4) << what << ": dq";
      EXPECT_LE(RelativeErrorTo(g.dk, finite_difference(&DoubleInputs::k)), 1e-4) << what << ": dk";
      EXPECT_LE(RelativeErrorTo(g.dv, finite_difference(&DoubleInputs::v)), 1e-4) << what << ": dv";
      EXPECT_LE(RelativeErrorTo(g.di, finite_difference(&DoubleInputs::i)), 1e-4) << what << ": di";
      EXPECT_LE(RelativeErrorTo(g.df, finite_difference(&DoubleInputs::f)), 1e-4) << what << ": df";
      EXPECT_LE(RelativeErrorTo(g.dc0, finite_difference(&DoubleInputs::c0)), 1e-4)
          << what << ": dc0";
      EXPECT_LE(RelativeErrorTo(g.dn0, finite_difference(&DoubleInputs::n0)), 1e-4)
          << what << ": dn0";
    }
  }
}

TEST(MlstmCpuTest, ExtremeGatesStayFiniteAndExact) {
  struct Regime {
    float i_mean, f_mean;
  };
  for (MlstmKind kind : kKinds) {
    for (Regime r :
         {Regime{50, 50}, Regime{50, -50}, Regime{-100, 50}, Regime{-100, -50}, Regime{100, 0}}) {
      const Inputs in = MakeInputs(kind, 2, 8, 8, {70, 3}, 17, r.i_mean, r.f_mean);
      const std::string what =
          KindName(kind) + " i~" + std::to_string(r.i_mean) + " f~" + std::to_string(r.f_mean);
      const Oracle ref = RunOracle(in, DoubleInputs(in));
      for (MixerForm form : {MixerForm::kRecurrent, MixerForm::kChunked}) {
        const Outputs out = RunOnce(in, form, 16);
        EXPECT_TRUE(AllFinite(out.h) && AllFinite(out.c) && AllFinite(out.n) && AllFinite(out.m))
            << what;
        // With m ≫ 0 the lower bound e^{-m} of the denominator vanishes and
        // h = C_tᵀq' / |q'ᵀn_t| inherits the cancellation of the dot product;
        // the states stay as exact as elsewhere.
        EXPECT_LE(RelativeErrorTo(out.h, ref.h, 1e-20), 1e-3) << what;
        EXPECT_LE(RelativeErrorTo(out.c, ref.c, 1e-20), 1e-5) << what;
        EXPECT_LE(RelativeErrorTo(out.n, ref.n, 1e-20), 1e-5) << what;
      }
      const Grads g = RunBackward(in, MakeCotangents(in, 18), 16);
      for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.di, &g.df, &g.dc0, &g.dn0}) {
        EXPECT_TRUE(AllFinite(*t)) << what;
      }
    }
  }
}

TEST(MlstmCpuTest, RejectsBadArguments) {
  const Inputs in = MakeInputs(MlstmKind::kExp, 2, 4, 4, {3, 2}, 19);
  Pools pools = MakePools(in);
  const std::vector<int32_t> cu = Offsets(in.lens);
  MlstmForwardArgs args = WholeArgs(in, pools, 4);
  SequenceBatch batch;
  batch.num_seqs = in.seqs();
  batch.cu_seqlens = cu;
  batch.state_slot = pools.slot;
  ASSERT_TRUE(MlstmForwardCpu(batch, args, MixerForm::kChunked).ok());

  auto expect_error = [&](const MlstmForwardArgs& bad, const SequenceBatch& bad_batch,
                          const std::string& field) {
    const absl::Status status = MlstmForwardCpu(bad_batch, bad, MixerForm::kChunked);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(std::string(status.message()).find(field), std::string::npos) << status;
  };
  MlstmForwardArgs bad = args;
  bad.v = Tensor::Zeros(DType::kF32, {5, 2, 3});
  expect_error(bad, batch, "MlstmForwardArgs.v");
  bad = args;
  bad.state_m = Tensor();
  expect_error(bad, batch, "MlstmForwardArgs.state_m");
  bad = args;
  bad.chunk_size = 0;
  expect_error(bad, batch, "MlstmForwardArgs.chunk_size");
  const std::vector<int32_t> far_slots = {0, 7}, same_slots = {1, 1}, short_cu = {0, 3, 4};
  SequenceBatch bad_batch = batch;
  bad_batch.state_slot = far_slots;
  expect_error(args, bad_batch, "state_slot");
  bad_batch.state_slot = same_slots;
  expect_error(args, bad_batch, "state_slot");
  bad_batch = batch;
  bad_batch.cu_seqlens = short_cu;
  expect_error(args, bad_batch, "cu_seqlens");
}

// ---------------------------------------------------------------------------
// Golden fixtures: B sequences of T tokens, [B,T,H,*] = packed [B*T,H,*].

class MlstmFixtureTest : public ::testing::TestWithParam<MlstmKind> {};

TEST_P(MlstmFixtureTest, MatchesGolden) {
  const MlstmKind kind = GetParam();
  LAIR_FIXTURE_OR_SKIP(path, "ops/mlstm_" + KindName(kind) + ".safetensors");
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto get = [&](const std::string& name) {
    auto t = (*file)->Get(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->ToF32() : Tensor();
  };
  const Tensor q = get("q");
  const int64_t b = q.dim(0), t = q.dim(1), h = q.dim(2), kd = q.dim(3);
  const int64_t vd = get("v").dim(3);
  auto packed = [&](const std::string& name) { return PackSequences(get(name)); };
  Inputs in;
  in.kind = kind;
  in.heads = static_cast<int>(h);
  in.key_dim = static_cast<int>(kd);
  in.value_dim = static_cast<int>(vd);
  in.eps = 1e-6f;
  in.lens.assign(b, static_cast<int>(t));
  in.q = packed("q");
  in.k = packed("k");
  in.v = packed("v");
  in.i = packed("i");
  in.f = packed("f");
  in.c0 = get("c0");
  in.n0 = get("n0");
  in.m0 = kind == MlstmKind::kExp ? get("m0") : Tensor::Zeros(DType::kF32, {b, h});

  for (MixerForm form : {MixerForm::kRecurrent, MixerForm::kChunked}) {
    const Outputs out = RunOnce(in, form, 64);
    EXPECT_LE(RelativeError(out.h, packed("h")), 1e-5);
    EXPECT_LE(RelativeError(out.c, get("ct")), 1e-5);
    EXPECT_LE(RelativeError(out.n, get("nt")), 1e-5);
    if (kind == MlstmKind::kExp) {
      EXPECT_LE(RelativeError(out.m, get("mt")), 1e-5);
    }
  }
  Cotangents d;
  d.dh = packed("dh");
  d.dct = get("dct");
  d.dnt = get("dnt");
  const Grads g = RunBackward(in, d, 64);
  EXPECT_LE(RelativeError(g.dq, packed("dq")), 1e-4);
  EXPECT_LE(RelativeError(g.dk, packed("dk")), 1e-4);
  EXPECT_LE(RelativeError(g.dv, packed("dv")), 1e-4);
  EXPECT_LE(RelativeError(g.di, packed("di")), 1e-4);
  EXPECT_LE(RelativeError(g.df, packed("df")), 1e-4);
  EXPECT_LE(RelativeError(g.dc0, get("dc0")), 1e-4);
  EXPECT_LE(RelativeError(g.dn0, get("dn0")), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, MlstmFixtureTest,
                         ::testing::Values(MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm),
                         [](const ::testing::TestParamInfo<MlstmKind>& info) {
                           return KindName(info.param);
                         });

}  // namespace
}  // namespace lair::kernels::cpu
