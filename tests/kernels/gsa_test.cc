// GSA CPU kernels: the golden fixture, a float64 recurrent oracle (specs/gsa.md
// Appendix A), the agreement of the recurrent, chunked and one-token forms,
// prefill split at arbitrary points, packed batches, gradients against finite
// differences, analytic cases and huge slot logits.
#include "kernels/cpu/gsa.h"

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
using mixer_test::FiniteDifference;
using mixer_test::GatherRows;
using mixer_test::MakePiece;
using mixer_test::Normal;
using mixer_test::Offsets;
using mixer_test::PackSequences;
using mixer_test::Piece;
using mixer_test::RelativeErrorTo;
using mixer_test::ScatterRows;
using mixer_test::StepCuts;
using mixer_test::ToDouble;

struct GsaInputs {
  int heads = 0, key_dim = 0, value_dim = 0, slots_m = 0;
  float scale = 1.0f;
  std::vector<int> lens;
  Tensor q, k, v, s, g;  // packed [N,H,K], [N,H,K], [N,H,V], [N,H,M], [N,H,M]
  Tensor hk0, hv0;       // [S,H,K,M], [S,H,M,V]

  int64_t tokens() const { return q.dim(0); }
  int seqs() const { return static_cast<int>(lens.size()); }
};

struct GsaOutputs {
  Tensor o, hk, hv;  // [N,H,V] and the final states [S,...]
};

struct GsaCotangents {
  Tensor d_o, d_hkt, d_hvt;
};

struct GsaGrads {
  Tensor dq, dk, dv, ds, dg, dhk0, dhv0;
};

// g = logσ(gate_scale·x)/tau as in a GSA layer; s = 1 − e^{g}, or an
// independent uniform input when `independent_s`.
GsaInputs MakeInputs(int heads, int key_dim, int value_dim, int slots_m, std::vector<int> lens,
                     uint32_t seed, float gate_scale = 1.0f, float tau = 8.0f,
                     bool independent_s = false) {
  std::mt19937 rng(seed);
  GsaInputs in;
  in.heads = heads;
  in.key_dim = key_dim;
  in.value_dim = value_dim;
  in.slots_m = slots_m;
  in.scale = 1.0f / std::sqrt(static_cast<float>(key_dim));
  in.lens = std::move(lens);
  const int64_t n = Offsets(in.lens).back(), seqs = in.seqs();
  in.q = Normal({n, heads, key_dim}, rng, 1);
  in.k = Normal({n, heads, key_dim}, rng, 1);
  in.v = Normal({n, heads, value_dim}, rng, 1);
  in.g = Normal({n, heads, slots_m}, rng, gate_scale);
  in.s = Tensor::Zeros(DType::kF32, {n, heads, slots_m});
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  for (int64_t e = 0; e < in.g.numel(); ++e) {
    const float x = in.g.f32()[e];
    const float g = (std::min(x, 0.0f) - std::log1p(std::exp(-std::fabs(x)))) / tau;
    in.g.f32()[e] = g;
    in.s.f32()[e] = independent_s ? uniform(rng) : -std::expm1(g);
  }
  in.hk0 = Normal({seqs, heads, key_dim, slots_m}, rng, 0.5f);
  in.hv0 = Normal({seqs, heads, slots_m, value_dim}, rng, 0.5f);
  return in;
}

// Pools holding sequence s in slot S − s, with one spare slot (slot 0).
struct Pools {
  Tensor hk, hv;
  std::vector<int32_t> slot;
};

Pools MakePools(const GsaInputs& in) {
  const int64_t seqs = in.seqs();
  Pools p;
  p.hk = Tensor::Zeros(DType::kF32, {seqs + 1, in.heads, in.key_dim, in.slots_m});
  p.hv = Tensor::Zeros(DType::kF32, {seqs + 1, in.heads, in.slots_m, in.value_dim});
  std::vector<int64_t> rows;
  for (int64_t s = 0; s < seqs; ++s) {
    p.slot.push_back(static_cast<int32_t>(seqs - s));
    rows.push_back(seqs - s);
  }
  ScatterRows(in.hk0, rows, p.hk);
  ScatterRows(in.hv0, rows, p.hv);
  return p;
}

GsaForwardArgs ArgsFor(const GsaInputs& in, int chunk) {
  GsaForwardArgs args;
  args.heads = in.heads;
  args.key_dim = in.key_dim;
  args.value_dim = in.value_dim;
  args.num_slots_m = in.slots_m;
  args.scale = in.scale;
  args.chunk_size = chunk;
  return args;
}

// The forward over all of `in` at once, states in `pools`.
GsaForwardArgs WholeArgs(const GsaInputs& in, const Pools& pools, int chunk) {
  GsaForwardArgs args = ArgsFor(in, chunk);
  args.q = in.q;
  args.k = in.k;
  args.v = in.v;
  args.s = in.s;
  args.g = in.g;
  args.o = Tensor::Zeros(DType::kF32, in.v.shape());
  args.state_k = pools.hk;
  args.state_v = pools.hv;
  return args;
}

// Piece p runs tokens [cuts[p], cuts[p+1]) of every sequence, states carried
// in the pools.
GsaOutputs RunPieces(const GsaInputs& in, MixerForm form, int chunk, const std::vector<int>& cuts) {
  Pools pools = MakePools(in);
  GsaOutputs out;
  out.o = Tensor::Zeros(DType::kF32, {in.tokens(), in.heads, in.value_dim});
  for (size_t p = 0; p + 1 < cuts.size(); ++p) {
    const Piece piece = MakePiece(in.lens, pools.slot, cuts[p], cuts[p + 1]);
    if (piece.empty()) continue;
    GsaForwardArgs args = ArgsFor(in, chunk);
    args.q = GatherRows(in.q, piece.rows);
    args.k = GatherRows(in.k, piece.rows);
    args.v = GatherRows(in.v, piece.rows);
    args.s = GatherRows(in.s, piece.rows);
    args.g = GatherRows(in.g, piece.rows);
    args.o = Tensor::Zeros(DType::kF32,
                           {static_cast<int64_t>(piece.rows.size()), in.heads, in.value_dim});
    args.state_k = pools.hk;
    args.state_v = pools.hv;
    const absl::Status status = GsaForwardCpu(piece.Batch(), args, form);
    EXPECT_TRUE(status.ok()) << status;
    ScatterRows(args.o, piece.rows, out.o);
  }
  std::vector<int64_t> slots(pools.slot.begin(), pools.slot.end());
  out.hk = GatherRows(pools.hk, slots);
  out.hv = GatherRows(pools.hv, slots);
  return out;
}

GsaOutputs RunOnce(const GsaInputs& in, MixerForm form, int chunk) {
  return RunPieces(in, form, chunk, {0, 1 << 30});
}

GsaOutputs RunStepwise(const GsaInputs& in) {
  return RunPieces(in, MixerForm::kAuto, 64, StepCuts(in.lens));
}

GsaCotangents MakeCotangents(const GsaInputs& in, uint32_t seed) {
  std::mt19937 rng(seed);
  return {Normal(in.v.shape(), rng, 1), Normal(in.hk0.shape(), rng, 1),
          Normal(in.hv0.shape(), rng, 1)};
}

GsaGrads RunBackward(const GsaInputs& in, const GsaCotangents& d, int chunk) {
  Pools pools = MakePools(in);
  const std::vector<int32_t> cu = Offsets(in.lens);
  GsaBackwardArgs args;
  args.fwd = WholeArgs(in, pools, chunk);
  args.d_o = d.d_o;
  args.d_hkt = d.d_hkt;
  args.d_hvt = d.d_hvt;
  GsaGrads g;
  g.dq = args.dq = Tensor::Zeros(DType::kF32, in.q.shape());
  g.dk = args.dk = Tensor::Zeros(DType::kF32, in.k.shape());
  g.dv = args.dv = Tensor::Zeros(DType::kF32, in.v.shape());
  g.ds = args.ds = Tensor::Zeros(DType::kF32, in.s.shape());
  g.dg = args.dg = Tensor::Zeros(DType::kF32, in.g.shape());
  g.dhk0 = args.d_hk0 = Tensor::Zeros(DType::kF32, in.hk0.shape());
  g.dhv0 = args.d_hv0 = Tensor::Zeros(DType::kF32, in.hv0.shape());
  const Tensor hk_before = pools.hk.Clone(), hv_before = pools.hv.Clone();
  SequenceBatch batch;
  batch.num_seqs = in.seqs();
  batch.cu_seqlens = cu;
  batch.state_slot = pools.slot;
  const absl::Status status = GsaBackwardCpu(batch, args);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(RelativeError(pools.hk, hk_before), 0.0) << "the backward wrote state_k";
  EXPECT_EQ(RelativeError(pools.hv, hv_before), 0.0) << "the backward wrote state_v";
  return g;
}

// ---------------------------------------------------------------------------
// Float64 oracle: the recurrence of specs/gsa.md §1.4 / Appendix A.

struct DoubleInputs {
  std::vector<double> q, k, v, s, g, hk0, hv0;
  explicit DoubleInputs(const GsaInputs& in)
      : q(ToDouble(in.q)),
        k(ToDouble(in.k)),
        v(ToDouble(in.v)),
        s(ToDouble(in.s)),
        g(ToDouble(in.g)),
        hk0(ToDouble(in.hk0)),
        hv0(ToDouble(in.hv0)) {}
};

struct Oracle {
  std::vector<double> o, hk, hv;
};

Oracle RunOracle(const GsaInputs& in, const DoubleInputs& x) {
  const int H = in.heads, K = in.key_dim, V = in.value_dim, M = in.slots_m;
  const std::vector<int32_t> cu = Offsets(in.lens);
  Oracle r;
  r.o.assign(in.tokens() * H * V, 0.0);
  r.hk = x.hk0;
  r.hv = x.hv0;
  std::vector<double> z(M);
  for (int seq = 0; seq < in.seqs(); ++seq) {
    for (int h = 0; h < H; ++h) {
      double* hk = &r.hk[(seq * H + h) * K * M];
      double* hv = &r.hv[(seq * H + h) * M * V];
      for (int t = cu[seq]; t < cu[seq + 1]; ++t) {
        const double* q = &x.q[(t * H + h) * K];
        const double* k = &x.k[(t * H + h) * K];
        const double* v = &x.v[(t * H + h) * V];
        const double* s = &x.s[(t * H + h) * M];
        const double* g = &x.g[(t * H + h) * M];
        for (int a = 0; a < K; ++a) {
          for (int c = 0; c < M; ++c) hk[a * M + c] = hk[a * M + c] * std::exp(g[c]) + k[a] * s[c];
        }
        for (int c = 0; c < M; ++c) {
          z[c] = 0;
          for (int a = 0; a < K; ++a) z[c] += in.scale * q[a] * hk[a * M + c];
        }
        const double top = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (int c = 0; c < M; ++c) sum += z[c] = std::exp(z[c] - top);
        for (int c = 0; c < M; ++c) {
          for (int b = 0; b < V; ++b) hv[c * V + b] = std::exp(g[c]) * hv[c * V + b] + s[c] * v[b];
        }
        for (int b = 0; b < V; ++b) {
          double o = 0;
          for (int c = 0; c < M; ++c) o += z[c] / sum * hv[c * V + b];
          r.o[(t * H + h) * V + b] = o;
        }
      }
    }
  }
  return r;
}

double Loss(const GsaInputs& in, const DoubleInputs& x, const GsaCotangents& d) {
  const Oracle r = RunOracle(in, x);
  return Dot(r.o, d.d_o) + Dot(r.hk, d.d_hkt) + Dot(r.hv, d.d_hvt);
}

void ExpectOutputsNear(const GsaOutputs& a, const GsaOutputs& b, double tol,
                       const std::string& what) {
  EXPECT_LE(RelativeError(a.o, b.o), tol) << what << ": o";
  EXPECT_LE(RelativeError(a.hk, b.hk), tol) << what << ": Hk";
  EXPECT_LE(RelativeError(a.hv, b.hv), tol) << what << ": Hv";
}

// ---------------------------------------------------------------------------

TEST(GsaCpuTest, OracleAgreesWithEveryForm) {
  struct Regime {
    float gate_scale, tau;
  };
  // Weak decay as in the models (tau 8) and strong decay (logits ×3, tau 1).
  for (Regime r : {Regime{1, 8}, Regime{3, 1}}) {
    const GsaInputs in = MakeInputs(2, 12, 10, 6, {1, 15, 64, 65, 130}, 21, r.gate_scale, r.tau);
    const std::string what = "tau " + std::to_string(r.tau);
    const Oracle ref = RunOracle(in, DoubleInputs(in));
    const GsaOutputs recurrent = RunOnce(in, MixerForm::kRecurrent, 64);
    EXPECT_LE(RelativeErrorTo(recurrent.o, ref.o), 1e-5) << what;
    EXPECT_LE(RelativeErrorTo(recurrent.hk, ref.hk), 1e-5) << what;
    EXPECT_LE(RelativeErrorTo(recurrent.hv, ref.hv), 1e-5) << what;
    for (int chunk : {1, 5, 16, 64}) {
      ExpectOutputsNear(RunOnce(in, MixerForm::kChunked, chunk), recurrent, 1e-5,
                        what + " chunk " + std::to_string(chunk));
    }
    ExpectOutputsNear(RunStepwise(in), recurrent, 1e-5, what + " stepwise");
  }
}

TEST(GsaCpuTest, SplitPrefillMatchesOnePass) {
  const GsaInputs in = MakeInputs(2, 8, 8, 4, {100, 40}, 22);
  const GsaOutputs whole = RunOnce(in, MixerForm::kChunked, 16);
  for (int cut : {1, 15, 16, 17, 63}) {
    ExpectOutputsNear(RunPieces(in, MixerForm::kChunked, 16, {0, cut, 1 << 30}), whole, 1e-5,
                      "cut " + std::to_string(cut));
  }
  std::vector<int> cuts = {0};
  for (int t = 33; t <= 100; ++t) cuts.push_back(t);
  ExpectOutputsNear(RunPieces(in, MixerForm::kAuto, 16, cuts), whole, 1e-5, "prefill + decode");
}

TEST(GsaCpuTest, PackedMatchesSeparate) {
  const GsaInputs in = MakeInputs(3, 8, 4, 5, {5, 70, 0, 33}, 23);
  const GsaOutputs packed = RunOnce(in, MixerForm::kChunked, 16);
  const std::vector<int32_t> cu = Offsets(in.lens);
  for (int s = 0; s < in.seqs(); ++s) {
    GsaInputs one = in;
    one.lens = {in.lens[s]};
    std::vector<int64_t> rows;
    for (int t = cu[s]; t < cu[s + 1]; ++t) rows.push_back(t);
    one.q = GatherRows(in.q, rows);
    one.k = GatherRows(in.k, rows);
    one.v = GatherRows(in.v, rows);
    one.s = GatherRows(in.s, rows);
    one.g = GatherRows(in.g, rows);
    one.hk0 = GatherRows(in.hk0, {s});
    one.hv0 = GatherRows(in.hv0, {s});
    GsaOutputs part;
    part.o = GatherRows(packed.o, rows);
    part.hk = GatherRows(packed.hk, {s});
    part.hv = GatherRows(packed.hv, {s});
    ExpectOutputsNear(part, RunOnce(one, MixerForm::kChunked, 16), 1e-6,
                      "sequence " + std::to_string(s));
  }
}

TEST(GsaCpuTest, GradientsMatchFiniteDifferences) {
  const GsaInputs in = MakeInputs(2, 3, 2, 3, {6, 1, 4}, 24, 2.0f, 1.0f, /*independent_s=*/true);
  const GsaCotangents d = MakeCotangents(in, 25);
  const DoubleInputs x(in);
  auto finite_difference = [&](std::vector<double> DoubleInputs::*field) {
    return FiniteDifference(x, field,
                            [&](const DoubleInputs& probe) { return Loss(in, probe, d); });
  };
  for (int chunk : {2, 64}) {
    const GsaGrads g = RunBackward(in, d, chunk);
    const std::string what = "chunk " + std::to_string(chunk);
    EXPECT_LE(RelativeErrorTo(g.dq, finite_difference(&DoubleInputs::q)), 1e-4) << what << ": dq";
    EXPECT_LE(RelativeErrorTo(g.dk, finite_difference(&DoubleInputs::k)), 1e-4) << what << ": dk";
    EXPECT_LE(RelativeErrorTo(g.dv, finite_difference(&DoubleInputs::v)), 1e-4) << what << ": dv";
    EXPECT_LE(RelativeErrorTo(g.ds, finite_difference(&DoubleInputs::s)), 1e-4) << what << ": ds";
    EXPECT_LE(RelativeErrorTo(g.dg, finite_difference(&DoubleInputs::g)), 1e-4) << what << ": dg";
    EXPECT_LE(RelativeErrorTo(g.dhk0, finite_difference(&DoubleInputs::hk0)), 1e-4)
        << what << ": dhk0";
    EXPECT_LE(RelativeErrorTo(g.dhv0, finite_difference(&DoubleInputs::hv0)), 1e-4)
        << what << ": dhv0";
  }
}

TEST(GsaCpuTest, FullForgettingReturnsTheValue) {
  // α → 0 (g = −60, s = 1): Hv_t = 1 v_tᵀ, so o_t = v_t whatever p_t is.
  GsaInputs in = MakeInputs(2, 8, 8, 4, {20, 9}, 26);
  std::fill_n(in.g.f32(), in.g.numel(), -60.0f);
  std::fill_n(in.s.f32(), in.s.numel(), 1.0f);
  for (MixerForm form : {MixerForm::kRecurrent, MixerForm::kChunked}) {
    EXPECT_LE(RelativeError(RunOnce(in, form, 8).o, in.v), 1e-6);
  }
}

TEST(GsaCpuTest, HugeSlotLogitsStayFinite) {
  GsaInputs in = MakeInputs(2, 16, 8, 8, {70, 3}, 27);
  for (int64_t e = 0; e < in.q.numel(); ++e) in.q.f32()[e] *= 1e3f;
  const Oracle ref = RunOracle(in, DoubleInputs(in));
  for (MixerForm form : {MixerForm::kRecurrent, MixerForm::kChunked}) {
    const GsaOutputs out = RunOnce(in, form, 16);
    EXPECT_TRUE(std::all_of(out.o.f32(), out.o.f32() + out.o.numel(),
                            [](float x) { return std::isfinite(x); }));
    // The softmax is nearly one-hot; a logit gap within rounding may flip it,
    // so compare loosely.
    EXPECT_LE(RelativeErrorTo(out.o, ref.o), 1e-3);
  }
}

TEST(GsaCpuTest, RejectsBadArguments) {
  GsaInputs in = MakeInputs(2, 4, 4, 3, {3, 2}, 28);
  Pools pools = MakePools(in);
  const std::vector<int32_t> cu = Offsets(in.lens);
  GsaForwardArgs args = WholeArgs(in, pools, 4);
  SequenceBatch batch;
  batch.num_seqs = in.seqs();
  batch.cu_seqlens = cu;
  batch.state_slot = pools.slot;
  ASSERT_TRUE(GsaForwardCpu(batch, args, MixerForm::kChunked).ok());

  auto expect_error = [&](const GsaForwardArgs& bad, const std::string& field) {
    const Tensor hk_before = pools.hk.Clone();
    const absl::Status status = GsaForwardCpu(batch, bad, MixerForm::kChunked);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(std::string(status.message()).find(field), std::string::npos) << status;
    EXPECT_EQ(RelativeError(pools.hk, hk_before), 0.0) << field << ": state_k written on error";
  };
  GsaForwardArgs bad = args;
  bad.s = Tensor::Zeros(DType::kF32, {5, 2, 4});
  expect_error(bad, "GsaForwardArgs.s");
  bad = args;
  bad.state_v = Tensor::Zeros(DType::kF32, {3, 2, 3, 5});
  expect_error(bad, "GsaForwardArgs.state_v");
  bad = args;
  bad.num_slots_m = 0;
  expect_error(bad, "GsaForwardArgs.num_slots_m");
  bad = args;
  bad.g = in.g.Clone();
  bad.g.f32()[7] = 0.5f;
  expect_error(bad, "GsaForwardArgs.g");
}

// ---------------------------------------------------------------------------
// Golden fixture: B sequences of T tokens, [B,T,H,*] = packed [B*T,H,*].

TEST(GsaFixtureTest, MatchesGolden) {
  LAIR_FIXTURE_OR_SKIP(path, "ops/gsa.safetensors");
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto get = [&](const std::string& name) {
    auto t = (*file)->Get(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->ToF32() : Tensor();
  };
  auto packed = [&](const std::string& name) { return PackSequences(get(name)); };
  GsaInputs in;
  in.q = packed("q");
  in.k = packed("k");
  in.v = packed("v");
  in.s = packed("s");
  in.g = packed("g");
  in.hk0 = get("hk0");
  in.hv0 = get("hv0");
  const Tensor raw_q = get("q");
  in.lens.assign(raw_q.dim(0), static_cast<int>(raw_q.dim(1)));
  in.heads = static_cast<int>(raw_q.dim(2));
  in.key_dim = static_cast<int>(raw_q.dim(3));
  in.value_dim = static_cast<int>(in.v.dim(2));
  in.slots_m = static_cast<int>(in.s.dim(2));
  in.scale = 0.125f;  // manifest.json: K^-0.5 with K = 64

  for (MixerForm form : {MixerForm::kRecurrent, MixerForm::kChunked}) {
    const GsaOutputs out = RunOnce(in, form, 64);
    EXPECT_LE(RelativeError(out.o, packed("o")), 1e-5);
    EXPECT_LE(RelativeError(out.hk, get("hkt")), 1e-5);
    EXPECT_LE(RelativeError(out.hv, get("hvt")), 1e-5);
  }
  const GsaGrads g = RunBackward(in, {packed("do"), get("dhkt"), get("dhvt")}, 64);
  EXPECT_LE(RelativeError(g.dq, packed("dq")), 1e-4);
  EXPECT_LE(RelativeError(g.dk, packed("dk")), 1e-4);
  EXPECT_LE(RelativeError(g.dv, packed("dv")), 1e-4);
  EXPECT_LE(RelativeError(g.ds, packed("ds")), 1e-4);
  EXPECT_LE(RelativeError(g.dg, packed("dg")), 1e-4);
  EXPECT_LE(RelativeError(g.dhk0, get("dhk0")), 1e-4);
  EXPECT_LE(RelativeError(g.dhv0, get("dhv0")), 1e-4);
}

}  // namespace
}  // namespace lair::kernels::cpu
