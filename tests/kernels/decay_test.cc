// Decay family on the CPU: a float64 oracle of the recurrence, the agreement
// of the chunked (several chunk sizes), recurrent and one-token forms, prefill
// split at arbitrary points, packed batches against separate runs, gradients
// against finite differences, strongly decaying gates, and the one-step decay
// shift of the unified backward (erratum U1).
#include "kernels/cpu/decay.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ula_core.h"

namespace lair::kernels::cpu {
namespace {

constexpr DecayKind kAllKinds[] = {DecayKind::kNone, DecayKind::kConstant, DecayKind::kScalar,
                                   DecayKind::kVector, DecayKind::kLeftRight};

std::string KindName(DecayKind kind) {
  switch (kind) {
    case DecayKind::kNone:
      return "none";
    case DecayKind::kConstant:
      return "constant";
    case DecayKind::kScalar:
      return "scalar";
    case DecayKind::kVector:
      return "vector";
    case DecayKind::kLeftRight:
      return "left_right";
  }
  return "?";
}

// How the log-decays are drawn.
enum class Gates {
  kMild,    // uniform in [-1, -0.01]
  kStrong,  // each entry either about -20 or in [-0.5, -0.01], half and half
  kBursts,  // about -20 on tokens 16..31 of every 48, mild elsewhere, so steep
            // and gentle sub-chunks alternate inside a chunk
};

// Everything one decay launch reads. Sequence s keeps its state in slot
// slots[s]; slot 0 is never used, so a slot mix-up shows.
struct Problem {
  DecayKind kind = DecayKind::kNone;
  int heads = 0, key_dim = 0, value_dim = 0;
  float scale = 1.0f;
  std::vector<int> lens;
  std::vector<int32_t> cu_seqlens, slots;
  Tensor q, k, v;               // [N,H,K], [N,H,K], [N,H,V]
  Tensor log_gamma, g, gk, gv;  // [H], [N,H], [N,H,K], [N,H,V]
  Tensor h0;                    // pool [seqs+1, H, K, V]
  Tensor d_o, d_ht;             // [N,H,V], [seqs,H,K,V]

  int64_t tokens() const { return cu_seqlens.back(); }
  int seqs() const { return static_cast<int>(lens.size()); }
  SequenceBatch batch() const {
    SequenceBatch b;
    b.num_seqs = seqs();
    b.cu_seqlens = cu_seqlens;
    b.state_slot = slots;
    b.max_seqlen = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
    return b;
  }
};

void Fill(const Tensor& t, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t e = 0; e < t.numel(); ++e) t.f32()[e] = dist(rng);
}

void FillGates(const Tensor& t, std::mt19937& rng, Gates gates) {
  if (gates == Gates::kMild) return Fill(t, rng, -1.0f, -0.01f);
  std::uniform_real_distribution<float> strong(-22.0f, -18.0f), mild(-0.5f, -0.01f);
  std::bernoulli_distribution coin(0.5);
  const int64_t row = t.numel() / t.dim(0);
  for (int64_t e = 0; e < t.numel(); ++e) {
    const bool steep =
        gates == Gates::kStrong ? coin(rng) : (e / row) % 48 >= 16 && (e / row) % 48 < 32;
    t.f32()[e] = steep ? strong(rng) : mild(rng);
  }
}

Problem MakeProblem(DecayKind kind, std::vector<int> lens, int heads, int key_dim, int value_dim,
                    uint32_t seed, Gates gates = Gates::kMild) {
  std::mt19937 rng(seed);
  Problem p;
  p.kind = kind;
  p.heads = heads;
  p.key_dim = key_dim;
  p.value_dim = value_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(key_dim));
  p.lens = std::move(lens);
  p.cu_seqlens = {0};
  for (int len : p.lens) p.cu_seqlens.push_back(p.cu_seqlens.back() + len);
  for (int s = 0; s < p.seqs(); ++s) p.slots.push_back(p.seqs() - s);
  const int64_t n = p.tokens(), seqs = p.seqs();
  p.q = Tensor::Zeros(DType::kF32, {n, heads, key_dim});
  p.k = Tensor::Zeros(DType::kF32, {n, heads, key_dim});
  p.v = Tensor::Zeros(DType::kF32, {n, heads, value_dim});
  p.d_o = Tensor::Zeros(DType::kF32, {n, heads, value_dim});
  p.h0 = Tensor::Zeros(DType::kF32, {seqs + 1, heads, key_dim, value_dim});
  p.d_ht = Tensor::Zeros(DType::kF32, {seqs, heads, key_dim, value_dim});
  for (const Tensor& t : {p.q, p.k, p.v, p.d_o}) Fill(t, rng, -1.0f, 1.0f);
  for (const Tensor& t : {p.h0, p.d_ht}) Fill(t, rng, -0.5f, 0.5f);
  if (kind == DecayKind::kConstant) {
    p.log_gamma = Tensor::Zeros(DType::kF32, {heads});
    FillGates(p.log_gamma, rng, gates);
  }
  if (kind == DecayKind::kScalar) {
    p.g = Tensor::Zeros(DType::kF32, {n, heads});
    FillGates(p.g, rng, gates);
  }
  if (kind == DecayKind::kVector || kind == DecayKind::kLeftRight) {
    p.gk = Tensor::Zeros(DType::kF32, {n, heads, key_dim});
    FillGates(p.gk, rng, gates);
  }
  if (kind == DecayKind::kLeftRight) {
    p.gv = Tensor::Zeros(DType::kF32, {n, heads, value_dim});
    FillGates(p.gv, rng, gates);
  }
  return p;
}

// Copies the rows of `t` (first dim = tokens) listed in `tokens`.
Tensor TakeTokens(const Tensor& t, const std::vector<int64_t>& tokens) {
  if (!t.defined()) return t;
  Shape shape = t.shape();
  const int64_t row = t.numel() / shape[0];
  shape[0] = static_cast<int64_t>(tokens.size());
  Tensor out = Tensor::Zeros(DType::kF32, shape);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::copy(t.f32() + tokens[i] * row, t.f32() + (tokens[i] + 1) * row, out.f32() + i * row);
  }
  return out;
}

// Tokens [from[i], to[i]) of sequence seqs[i], for every i, as a problem of
// its own with the same slots.
Problem Part(const Problem& p, const std::vector<int>& seqs, const std::vector<int>& from,
             const std::vector<int>& to) {
  Problem part = p;
  part.lens.clear();
  part.slots.clear();
  part.cu_seqlens = {0};
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < seqs.size(); ++i) {
    part.lens.push_back(to[i] - from[i]);
    part.slots.push_back(p.slots[seqs[i]]);
    part.cu_seqlens.push_back(part.cu_seqlens.back() + to[i] - from[i]);
    for (int t = from[i]; t < to[i]; ++t) tokens.push_back(p.cu_seqlens[seqs[i]] + t);
  }
  part.q = TakeTokens(p.q, tokens);
  part.k = TakeTokens(p.k, tokens);
  part.v = TakeTokens(p.v, tokens);
  part.d_o = TakeTokens(p.d_o, tokens);
  part.g = TakeTokens(p.g, tokens);
  part.gk = TakeTokens(p.gk, tokens);
  part.gv = TakeTokens(p.gv, tokens);
  return part;
}

DecayForwardArgs ArgsOf(const Problem& p, int chunk_size) {
  DecayForwardArgs a;
  a.kind = p.kind;
  a.heads = p.heads;
  a.key_dim = p.key_dim;
  a.value_dim = p.value_dim;
  a.scale = p.scale;
  a.chunk_size = chunk_size;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.log_gamma = p.log_gamma;
  a.g = p.g;
  a.gk = p.gk;
  a.gv = p.gv;
  return a;
}

// Runs the forward with `pool` as the state pool (updated in place); returns o.
Tensor Forward(const Problem& p, const Tensor& pool, MixerForm form, int chunk_size = 64) {
  DecayForwardArgs a = ArgsOf(p, chunk_size);
  a.o = Tensor::Zeros(DType::kF32, {p.tokens(), p.heads, p.value_dim});
  a.state = pool;
  const absl::Status status = DecayForwardCpu(p.batch(), a, form);
  EXPECT_TRUE(status.ok()) << status;
  return a.o;
}

struct Grads {
  Tensor dq, dk, dv, d_log_gamma, dg, dgk, dgv, dh0;
};

Grads Backward(const Problem& p, MixerForm form, int chunk_size = 64) {
  DecayBackwardArgs a;
  a.fwd = ArgsOf(p, chunk_size);
  a.fwd.state = p.h0;
  a.d_o = p.d_o;
  a.d_ht = p.d_ht;
  const int64_t n = p.tokens(), H = p.heads, K = p.key_dim, V = p.value_dim;
  a.dq = Tensor::Zeros(DType::kF32, {n, H, K});
  a.dk = Tensor::Zeros(DType::kF32, {n, H, K});
  a.dv = Tensor::Zeros(DType::kF32, {n, H, V});
  a.dh0 = Tensor::Zeros(DType::kF32, {p.seqs(), H, K, V});
  if (p.kind == DecayKind::kConstant) a.d_log_gamma = Tensor::Zeros(DType::kF32, {H});
  if (p.kind == DecayKind::kScalar) a.dg = Tensor::Zeros(DType::kF32, {n, H});
  if (p.kind == DecayKind::kVector || p.kind == DecayKind::kLeftRight) {
    a.dgk = Tensor::Zeros(DType::kF32, {n, H, K});
  }
  if (p.kind == DecayKind::kLeftRight) a.dgv = Tensor::Zeros(DType::kF32, {n, H, V});
  const absl::Status status = DecayBackwardCpu(p.batch(), a, form);
  EXPECT_TRUE(status.ok()) << status;
  return {a.dq, a.dk, a.dv, a.d_log_gamma, a.dg, a.dgk, a.dgv, a.dh0};
}

std::vector<double> ToDouble(const Tensor& t) {
  if (!t.defined()) return {};
  return std::vector<double>(t.f32(), t.f32() + t.numel());
}

// The recurrence in float64, token by token, on a copy of the inputs that
// finite differences may perturb.
struct Oracle {
  explicit Oracle(const Problem& p)
      : p(p),
        q(ToDouble(p.q)),
        k(ToDouble(p.k)),
        v(ToDouble(p.v)),
        log_gamma(ToDouble(p.log_gamma)),
        g(ToDouble(p.g)),
        gk(ToDouble(p.gk)),
        gv(ToDouble(p.gv)),
        h0(ToDouble(p.h0)),
        d_o(ToDouble(p.d_o)),
        d_ht(ToDouble(p.d_ht)) {}

  // L = <o, d_o> + Σ_s <S_final, d_ht>; fills o [N,H,V] and the final states
  // [seqs,H,K,V] when asked.
  double Run(std::vector<double>* o = nullptr, std::vector<double>* finals = nullptr) const {
    const int H = p.heads, K = p.key_dim, V = p.value_dim;
    if (o != nullptr) o->assign(p.tokens() * H * V, 0.0);
    if (finals != nullptr) finals->assign(int64_t{p.seqs()} * H * K * V, 0.0);
    double loss = 0;
    std::vector<double> S(K * V), lk(K), lv(V), out(V);
    for (int s = 0; s < p.seqs(); ++s) {
      for (int h = 0; h < H; ++h) {
        const double* init = h0.data() + (int64_t{p.slots[s]} * H + h) * K * V;
        std::copy(init, init + K * V, S.begin());
        for (int64_t t = p.cu_seqlens[s]; t < p.cu_seqlens[s + 1]; ++t) {
          for (int a = 0; a < K; ++a) {
            lk[a] = p.kind == DecayKind::kConstant ? log_gamma[h]
                    : p.kind == DecayKind::kScalar ? g[t * H + h]
                    : (p.kind == DecayKind::kVector || p.kind == DecayKind::kLeftRight)
                        ? gk[(t * H + h) * K + a]
                        : 0.0;
          }
          for (int b = 0; b < V; ++b)
            lv[b] = p.kind == DecayKind::kLeftRight ? gv[(t * H + h) * V + b] : 0.0;
          const double* qt = q.data() + (t * H + h) * K;
          const double* kt = k.data() + (t * H + h) * K;
          const double* vt = v.data() + (t * H + h) * V;
          std::fill(out.begin(), out.end(), 0.0);
          for (int a = 0; a < K; ++a) {
            for (int b = 0; b < V; ++b) {
              double& e = S[a * V + b];
              e = std::exp(lk[a] + lv[b]) * e + kt[a] * vt[b];
              out[b] += p.scale * qt[a] * e;
            }
          }
          for (int b = 0; b < V; ++b) {
            loss += out[b] * d_o[(t * H + h) * V + b];
            if (o != nullptr) (*o)[(t * H + h) * V + b] = out[b];
          }
        }
        const double* dst = d_ht.data() + (int64_t{s} * H + h) * K * V;
        for (int e = 0; e < K * V; ++e) loss += S[e] * dst[e];
        if (finals != nullptr)
          std::copy(S.begin(), S.end(), finals->begin() + (int64_t{s} * H + h) * K * V);
      }
    }
    return loss;
  }

  const Problem& p;
  std::vector<double> q, k, v, log_gamma, g, gk, gv, h0, d_o, d_ht;
};

double RelErr(const std::vector<double>& ours, const std::vector<double>& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double diff = 0, norm = 0;
  for (size_t e = 0; e < ours.size() && e < ref.size(); ++e) {
    diff += (ours[e] - ref[e]) * (ours[e] - ref[e]);
    norm += ref[e] * ref[e];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

bool AllFinite(const Tensor& t) {
  return std::all_of(t.f32(), t.f32() + t.numel(), [](float x) { return std::isfinite(x); });
}

// The final state of every sequence, read from its slot.
std::vector<double> SlotStates(const Problem& p, const Tensor& pool) {
  const int64_t per_slot = int64_t{p.heads} * p.key_dim * p.value_dim;
  std::vector<double> out;
  for (int s = 0; s < p.seqs(); ++s) {
    const float* src = pool.f32() + p.slots[s] * per_slot;
    out.insert(out.end(), src, src + per_slot);
  }
  return out;
}

// --- Forward ------------------------------------------------------------------

TEST(DecayCpuTest, EveryFormMatchesTheFloat64Oracle) {
  for (DecayKind kind : kAllKinds) {
    SCOPED_TRACE(KindName(kind));
    const Problem p = MakeProblem(kind, {1, 5, 31, 33, 97, 200}, 2, 8, 12, 11);
    std::vector<double> o_ref, s_ref;
    Oracle(p).Run(&o_ref, &s_ref);
    struct Case {
      MixerForm form;
      int chunk;
    };
    for (const Case c : {Case{MixerForm::kRecurrent, 64}, Case{MixerForm::kChunked, 16},
                         Case{MixerForm::kChunked, 32}, Case{MixerForm::kChunked, 64},
                         Case{MixerForm::kChunked, 7}}) {
      SCOPED_TRACE(c.chunk);
      const Tensor pool = p.h0.Clone();
      const Tensor o = Forward(p, pool, c.form, c.chunk);
      EXPECT_LT(RelErr(ToDouble(o), o_ref), 1e-5);
      EXPECT_LT(RelErr(SlotStates(p, pool), s_ref), 1e-5);
      // Slot 0 belongs to no sequence and must be left alone.
      EXPECT_TRUE(std::equal(pool.f32(), pool.f32() + pool.numel() / pool.dim(0), p.h0.f32()));
    }
  }
}

TEST(DecayCpuTest, OneTokenAtATimeMatchesOnePass) {
  for (DecayKind kind : kAllKinds) {
    SCOPED_TRACE(KindName(kind));
    const Problem p = MakeProblem(kind, {40, 3, 70}, 3, 6, 5, 12);
    const Tensor pool_full = p.h0.Clone();
    const Tensor o_full = Forward(p, pool_full, MixerForm::kChunked, 16);

    // Every step is one decode launch: one token of each unfinished sequence.
    const Tensor pool = p.h0.Clone();
    Tensor o_steps = Tensor::Zeros(DType::kF32, o_full.shape());
    const int64_t row = int64_t{p.heads} * p.value_dim;
    for (int t = 0; t < 70; ++t) {
      std::vector<int> seqs, from, to;
      for (int s = 0; s < p.seqs(); ++s) {
        if (t < p.lens[s]) {
          seqs.push_back(s);
          from.push_back(t);
          to.push_back(t + 1);
        }
      }
      const Tensor o = Forward(Part(p, seqs, from, to), pool, MixerForm::kAuto);
      for (size_t i = 0; i < seqs.size(); ++i) {
        std::copy(o.f32() + i * row, o.f32() + (i + 1) * row,
                  o_steps.f32() + (p.cu_seqlens[seqs[i]] + t) * row);
      }
    }
    EXPECT_LT(RelativeError(o_steps, o_full), 1e-5);
    EXPECT_LT(RelativeError(pool, pool_full), 1e-5);
  }
}

TEST(DecayCpuTest, SplitPrefillMatchesOnePass) {
  for (DecayKind kind : kAllKinds) {
    SCOPED_TRACE(KindName(kind));
    const Problem p = MakeProblem(kind, {150}, 2, 8, 8, 13);
    const Tensor pool_full = p.h0.Clone();
    const Tensor o_full = Forward(p, pool_full, MixerForm::kChunked);
    for (int cut : {1, 17, 64, 100, 149}) {
      SCOPED_TRACE(cut);
      const Tensor pool = p.h0.Clone();
      const Tensor o1 = Forward(Part(p, {0}, {0}, {cut}), pool, MixerForm::kChunked);
      const Tensor o2 = Forward(Part(p, {0}, {cut}, {150}), pool, MixerForm::kChunked);
      Tensor o = Tensor::Zeros(DType::kF32, o_full.shape());
      std::copy(o1.f32(), o1.f32() + o1.numel(), o.f32());
      std::copy(o2.f32(), o2.f32() + o2.numel(), o.f32() + o1.numel());
      EXPECT_LT(RelativeError(o, o_full), 1e-5);
      EXPECT_LT(RelativeError(pool, pool_full), 1e-5);
    }
  }
}

TEST(DecayCpuTest, PackedBatchMatchesSeparateRuns) {
  for (DecayKind kind : kAllKinds) {
    SCOPED_TRACE(KindName(kind));
    const Problem p = MakeProblem(kind, {37, 1, 0, 130, 64}, 2, 4, 6, 14);
    const Tensor pool = p.h0.Clone();
    const Tensor o = Forward(p, pool, MixerForm::kChunked, 32);
    const int64_t row = int64_t{p.heads} * p.value_dim;
    const int64_t per_slot = pool.numel() / pool.dim(0);
    for (int s = 0; s < p.seqs(); ++s) {
      SCOPED_TRACE(s);
      const Tensor alone_pool = p.h0.Clone();
      const Tensor alone =
          Forward(Part(p, {s}, {0}, {p.lens[s]}), alone_pool, MixerForm::kChunked, 32);
      const Tensor mine = Tensor::FromFloats(
          {p.lens[s] * row},
          std::vector<float>(o.f32() + p.cu_seqlens[s] * row, o.f32() + p.cu_seqlens[s + 1] * row));
      if (p.lens[s] > 0) {
        EXPECT_LT(RelativeError(mine, alone.Reshape({p.lens[s] * row})), 1e-6);
      }
      const float* slot = pool.f32() + p.slots[s] * per_slot;
      const float* slot_alone = alone_pool.f32() + p.slots[s] * per_slot;
      EXPECT_TRUE(std::equal(slot, slot + per_slot, slot_alone));
    }
  }
}

TEST(DecayCpuTest, ZeroInitialStateIgnoresTheSlots) {
  Problem p = MakeProblem(DecayKind::kVector, {20, 9}, 2, 4, 4, 15);
  SequenceBatch batch = p.batch();
  batch.zero_initial_state = true;
  DecayForwardArgs a = ArgsOf(p, 8);
  a.o = Tensor::Zeros(DType::kF32, {p.tokens(), 2, 4});
  a.state = p.h0.Clone();
  ASSERT_TRUE(DecayForwardCpu(batch, a, MixerForm::kChunked).ok());

  std::fill(p.h0.f32(), p.h0.f32() + p.h0.numel(), 0.0f);
  std::vector<double> o_ref, s_ref;
  Oracle(p).Run(&o_ref, &s_ref);
  EXPECT_LT(RelErr(ToDouble(a.o), o_ref), 1e-5);
}

TEST(DecayCpuTest, StrongDecayStaysFiniteAndExact) {
  for (auto [kind, gates] : {std::pair{DecayKind::kConstant, Gates::kStrong},
                             std::pair{DecayKind::kScalar, Gates::kStrong},
                             std::pair{DecayKind::kVector, Gates::kStrong},
                             std::pair{DecayKind::kLeftRight, Gates::kStrong},
                             std::pair{DecayKind::kScalar, Gates::kBursts},
                             std::pair{DecayKind::kVector, Gates::kBursts},
                             std::pair{DecayKind::kLeftRight, Gates::kBursts}}) {
    SCOPED_TRACE(KindName(kind) + (gates == Gates::kBursts ? " bursts" : " strong"));
    const Problem p = MakeProblem(kind, {130, 77}, 2, 16, 8, 16, gates);
    std::vector<double> o_ref, s_ref;
    Oracle(p).Run(&o_ref, &s_ref);
    for (int chunk : {16, 64}) {
      const Tensor pool = p.h0.Clone();
      const Tensor o = Forward(p, pool, MixerForm::kChunked, chunk);
      ASSERT_TRUE(AllFinite(o));
      ASSERT_TRUE(AllFinite(pool));
      EXPECT_LT(RelErr(ToDouble(o), o_ref), 1e-5);
      EXPECT_LT(RelErr(SlotStates(p, pool), s_ref), 1e-5);
    }
    const Grads chunked = Backward(p, MixerForm::kChunked, 64);
    const Grads recurrent = Backward(p, MixerForm::kRecurrent);
    for (auto [name, a, b] :
         {std::tuple{"dq", chunked.dq, recurrent.dq}, std::tuple{"dk", chunked.dk, recurrent.dk},
          std::tuple{"dv", chunked.dv, recurrent.dv}, std::tuple{"dh0", chunked.dh0, recurrent.dh0},
          std::tuple{"dgk", chunked.dgk, recurrent.dgk}, std::tuple{"dg", chunked.dg, recurrent.dg},
          std::tuple{"dgv", chunked.dgv, recurrent.dgv}}) {
      if (!a.defined()) continue;
      SCOPED_TRACE(name);
      ASSERT_TRUE(AllFinite(a));
      EXPECT_LT(RelativeError(a, b), 1e-4);
    }
  }
}

TEST(DecayCpuTest, Bf16ActivationsStayWithinBf16Tolerance) {
  const Problem p = MakeProblem(DecayKind::kLeftRight, {50, 20}, 2, 8, 8, 17);
  const Tensor pool_f32 = p.h0.Clone();
  const Tensor o_f32 = Forward(p, pool_f32, MixerForm::kChunked);

  auto bf16 = [](const Tensor& t) {
    Tensor out = Tensor::Zeros(DType::kBF16, t.shape());
    for (int64_t e = 0; e < t.numel(); ++e) out.data<uint16_t>()[e] = FloatToBF16(t.f32()[e]);
    return out;
  };
  DecayForwardArgs a = ArgsOf(p, 64);
  a.q = bf16(p.q);
  a.k = bf16(p.k);
  a.v = bf16(p.v);
  a.o = Tensor::Zeros(DType::kBF16, o_f32.shape());
  a.state = p.h0.Clone();
  ASSERT_TRUE(DecayForwardCpu(p.batch(), a, MixerForm::kChunked).ok());
  EXPECT_LT(RelativeError(a.o.ToF32(), o_f32), 2e-2);
  EXPECT_LT(RelativeError(a.state, pool_f32), 2e-2);
}

// --- Backward -----------------------------------------------------------------

// Checks a few entries of `ours` against central differences of the float64
// loss in `field` (entry e of the gradient is entry map(e) of the field).
template <typename Map>
void ExpectMatchesFiniteDifferences(const char* name, const Tensor& ours, Oracle& oracle,
                                    std::vector<double> Oracle::*field, Map map,
                                    std::mt19937& rng) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(ours.defined());
  double rms = 0;
  for (int64_t e = 0; e < ours.numel(); ++e) rms += double{ours.f32()[e]} * ours.f32()[e];
  rms = std::sqrt(rms / ours.numel());
  std::uniform_int_distribution<int64_t> pick(0, ours.numel() - 1);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t e = trial == 0 ? 0 : pick(rng);
    double& x = (oracle.*field)[map(e)];
    const double saved = x, h = 1e-6;
    x = saved + h;
    const double up = oracle.Run();
    x = saved - h;
    const double down = oracle.Run();
    x = saved;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(ours.f32()[e], fd, 1e-4 * std::max(std::abs(fd), rms)) << "entry " << e;
  }
}

TEST(DecayCpuTest, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(18);
  for (DecayKind kind : kAllKinds) {
    for (MixerForm form : {MixerForm::kChunked, MixerForm::kRecurrent}) {
      SCOPED_TRACE(KindName(kind) + (form == MixerForm::kChunked ? " chunked" : " recurrent"));
      const Problem p = MakeProblem(kind, {20, 45}, 2, 6, 5, 19);
      const Grads grads = Backward(p, form, 16);
      Oracle oracle(p);
      auto same = [](int64_t e) { return e; };
      ExpectMatchesFiniteDifferences("dq", grads.dq, oracle, &Oracle::q, same, rng);
      ExpectMatchesFiniteDifferences("dk", grads.dk, oracle, &Oracle::k, same, rng);
      ExpectMatchesFiniteDifferences("dv", grads.dv, oracle, &Oracle::v, same, rng);
      // dh0 is per sequence, h0 per slot.
      const int64_t per_slot = int64_t{p.heads} * p.key_dim * p.value_dim;
      auto slot_of = [&](int64_t e) { return p.slots[e / per_slot] * per_slot + e % per_slot; };
      ExpectMatchesFiniteDifferences("dh0", grads.dh0, oracle, &Oracle::h0, slot_of, rng);
      if (kind == DecayKind::kConstant) {
        ExpectMatchesFiniteDifferences("d_log_gamma", grads.d_log_gamma, oracle, &Oracle::log_gamma,
                                       same, rng);
      }
      if (kind == DecayKind::kScalar)
        ExpectMatchesFiniteDifferences("dg", grads.dg, oracle, &Oracle::g, same, rng);
      if (kind == DecayKind::kVector || kind == DecayKind::kLeftRight) {
        ExpectMatchesFiniteDifferences("dgk", grads.dgk, oracle, &Oracle::gk, same, rng);
      }
      if (kind == DecayKind::kLeftRight) {
        ExpectMatchesFiniteDifferences("dgv", grads.dgv, oracle, &Oracle::gv, same, rng);
      }
    }
  }
}

TEST(DecayCpuTest, BackwardFormsAndChunkSizesAgree) {
  for (DecayKind kind : kAllKinds) {
    SCOPED_TRACE(KindName(kind));
    const Problem p = MakeProblem(kind, {1, 63, 130}, 2, 12, 10, 20);
    const Grads ref = Backward(p, MixerForm::kRecurrent);
    for (int chunk : {16, 32, 64}) {
      SCOPED_TRACE(chunk);
      const Grads g = Backward(p, MixerForm::kChunked, chunk);
      EXPECT_LT(RelativeError(g.dq, ref.dq), 1e-5);
      EXPECT_LT(RelativeError(g.dk, ref.dk), 1e-5);
      EXPECT_LT(RelativeError(g.dv, ref.dv), 1e-5);
      EXPECT_LT(RelativeError(g.dh0, ref.dh0), 1e-5);
      if (g.dgk.defined()) {
        EXPECT_LT(RelativeError(g.dgk, ref.dgk), 1e-4);
      }
      if (g.dgv.defined()) {
        EXPECT_LT(RelativeError(g.dgv, ref.dgv), 1e-4);
      }
      if (g.dg.defined()) {
        EXPECT_LT(RelativeError(g.dg, ref.dg), 1e-4);
      }
    }
  }
}

// Erratum U1: the paper's dK = f(V, dO, Q, R, L, reverse) with unshifted decays
// is wrong for time-varying decays; the shifted call is what DecayBackwardCpu
// must compute. Guards against "fixing" the shift away.
TEST(DecayCpuTest, UnifiedBackwardNeedsTheShiftedDecays) {
  Problem p = MakeProblem(DecayKind::kVector, {50}, 1, 6, 5, 21);
  std::fill(p.d_ht.f32(), p.d_ht.f32() + p.d_ht.numel(), 0.0f);
  const Grads grads = Backward(p, MixerForm::kChunked);
  for (bool shifted : {true, false}) {
    UlaOperands ops;
    ops.length = 50;
    ops.q = RowsView{p.v.f32(), 5, 5};
    ops.k = RowsView{p.d_o.f32(), 5, 5};
    ops.v = RowsView{p.q.f32(), 6, 6, p.scale};
    ops.right = LogDecayView{LogDecayView::Kind::kVector, p.gk.f32(), 6, shifted};
    ops.reverse = true;
    std::vector<float> state(30, 0.0f);
    Tensor dk = Tensor::Zeros(DType::kF32, {50, 1, 6});
    UlaPass(ops, UlaForm::kChunked, 16, state.data(), dk.f32(), 6);
    if (shifted) {
      EXPECT_LT(RelativeError(dk, grads.dk), 1e-5);
    } else {
      EXPECT_GT(RelativeError(dk, grads.dk), 1e-2);
    }
  }
}

// --- Argument checks ------------------------------------------------------------

TEST(DecayCpuTest, RejectsBadArgumentsNamingTheField) {
  const Problem p = MakeProblem(DecayKind::kScalar, {10, 6}, 2, 4, 4, 22);
  auto forward_error = [&](auto mutate) {
    Problem bad = p;
    DecayForwardArgs a = ArgsOf(bad, 64);
    a.o = Tensor::Zeros(DType::kF32, {bad.tokens(), 2, 4});
    a.state = p.h0.Clone();
    SequenceBatch batch = bad.batch();
    std::vector<int32_t> cu = bad.cu_seqlens, slots = bad.slots;
    mutate(a, cu, slots);
    batch.cu_seqlens = cu;
    batch.state_slot = slots;
    const absl::Status status = DecayForwardCpu(batch, a, MixerForm::kChunked);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  using Cu = std::vector<int32_t>;
  EXPECT_NE(
      forward_error([](DecayForwardArgs&, Cu& cu, Cu&) { cu.back() = 15; }).find("cu_seqlens"),
      std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs&, Cu& cu, Cu&) {
              cu = {0, 12, 10, 16};
            }).find("cu_seqlens"),
            std::string::npos);
  EXPECT_NE(
      forward_error([](DecayForwardArgs&, Cu&, Cu& slots) { slots[0] = 3; }).find("state_slot"),
      std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs&, Cu&, Cu& slots) {
              slots[0] = slots[1];
            }).find("state_slot"),
            std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs& a, Cu&, Cu&) {
              a.k = Tensor::Zeros(DType::kF32, {16, 2, 5});
            }).find("k:"),
            std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs& a, Cu&, Cu&) { a.g = Tensor(); }).find("g:"),
            std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs& a, Cu&, Cu&) {
              a.g = a.g.Clone();
              a.g.f32()[3] = 0.5f;
            }).find("g:"),
            std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs& a, Cu&, Cu&) {
              a.state = Tensor::Zeros(DType::kBF16, {3, 2, 4, 4});
            }).find("state"),
            std::string::npos);
  EXPECT_NE(
      forward_error([](DecayForwardArgs& a, Cu&, Cu&) { a.chunk_size = 0; }).find("chunk_size"),
      std::string::npos);
  EXPECT_NE(forward_error([](DecayForwardArgs& a, Cu&, Cu&) { a.o = Tensor(); }).find("o:"),
            std::string::npos);
}

}  // namespace
}  // namespace lair::kernels::cpu
