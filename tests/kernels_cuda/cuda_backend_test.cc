// CudaBackend against CpuBackend on random packed batches (ragged lengths,
// shuffled slots, nonzero initial states): every decay kind forward (chunked
// and the one-token step) and backward, GSA forward and backward, every mLSTM
// kind forward (chunked and step) and backward, in f32 (rounding-level
// agreement) and bf16 (inputs rounded, fp32 accumulation); keys wider than a
// scan tile; the fast mode's bf16 rounding of scan operands; and the golden ops
// fixtures through
// VerifyOp, as `lair verify ops --device cuda` runs them. Skips when no GPU is
// present (and the fixture test when the fixtures are absent).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/verify_ops.h"
#include "tests/kernels_cuda/cuda_vs_cpu.h"

namespace lair::kernels {
namespace {

constexpr double kF32Tol = 1e-4;
constexpr double kBf16Tol = 2e-2;

class CudaVsCpu : public CudaVsCpuTest {
 protected:
  CudaVsCpu() : CudaVsCpuTest(7) {}

  // One decay forward's arguments for each backend over batch_, from the same
  // random inputs: q/k/v in `dt` (the CPU's rounded to it and held in fp32),
  // fp32 gates, initial states h0 in the pool's S + 1 slots, the GPU output
  // poisoned so that every element must be written.
  struct DecayPair {
    DecayForwardArgs cpu, gpu;
    Tensor h0;  // host [S + 1, H, K, V]
  };
  DecayPair MakeDecayPair(DecayKind kind, DType dt, int H, int K, int V, float scale) {
    const int64_t n = offsets_.back();
    const int S = batch_.num_seqs;
    const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1), v = Rand({n, H, V}, -1, 1);
    const Tensor lg = Rand({H}, -0.5f, -0.01f), g = Rand({n, H}, -1, -0.01f);
    const Tensor gk = Rand({n, H, K}, -1, -0.01f), gv = Rand({n, H, V}, -1, -0.01f);
    DecayPair p;
    p.h0 = Rand({S + 1, H, K, V}, -1, 1);
    DecayForwardArgs &c = p.cpu, &d = p.gpu;
    for (DecayForwardArgs* a : {&c, &d}) {
      a->kind = kind;
      a->heads = H, a->key_dim = K, a->value_dim = V, a->scale = scale;
    }
    c.q = Cpu(q, dt), c.k = Cpu(k, dt), c.v = Cpu(v, dt);
    d.q = Gpu(q, dt), d.k = Gpu(k, dt), d.v = Gpu(v, dt);
    c.log_gamma = lg.Clone(), c.g = g.Clone(), c.gk = gk.Clone(), c.gv = gv.Clone();
    d.log_gamma = Gpu(lg, DType::kF32), d.g = Gpu(g, DType::kF32);
    d.gk = Gpu(gk, DType::kF32), d.gv = Gpu(gv, DType::kF32);
    c.o = Tensor::Zeros(DType::kF32, {n, H, V});
    d.o = Gpu(Rand({n, H, V}, 7, 8), dt);
    c.state = p.h0.Clone();
    d.state = Gpu(p.h0, DType::kF32);
    return p;
  }

  // MlstmBackward on the GPU against the CPU over batch_ (H = 2), from random
  // inputs with forget-gate pre-activations in [f_lo, f_hi], initial states
  // in the pool's slots (unless batch_ starts from zero), every cotangent
  // present and every GPU output poisoned first.
  // Which state cotangents come in and which state gradients are asked for.
  enum class StateGrads {
    kAll,       // d_ct, d_nt in; d_c0, d_n0 out
    kCellOnly,  // d_ct in; d_c0, d_n0 out (no cotangent reaches n)
    kNone,      // none (training from zero states)
  };

  // kept_forward: the GPU's forward runs first, keeping h and q'ᵀn
  // (MlstmForwardArgs::norm_dot, checked against the CPU's) for the backward
  // to read instead of running the forward again.
  void CompareMlstmBackward(MlstmKind kind, DType dt, int K, int V, float f_lo, float f_hi,
                            const std::string& what, StateGrads grads = StateGrads::kAll,
                            bool kept_forward = false) {
    const int64_t n = offsets_.back();
    const int H = 2, S = batch_.num_seqs;
    const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1), v = Rand({n, H, V}, -1, 1);
    const Tensor ig = Rand({n, H}, -3, 3), fg = Rand({n, H}, f_lo, f_hi);
    const Tensor c0 = Rand({S + 1, H, K, V}, -1, 1), n0 = Rand({S + 1, H, K}, -1, 1);
    const Tensor m0 = Rand({S + 1, H}, -1, 1), d_h = Rand({n, H, V}, -1, 1);
    const Tensor d_ct = Rand({S, H, K, V}, -1, 1), d_nt = Rand({S, H, K}, -1, 1);
    MlstmBackwardArgs c, d;
    for (MlstmBackwardArgs* b : {&c, &d}) {
      b->fwd.kind = kind, b->fwd.heads = H, b->fwd.key_dim = K, b->fwd.value_dim = V;
    }
    c.fwd.q = Cpu(q, dt), c.fwd.k = Cpu(k, dt), c.fwd.v = Cpu(v, dt);
    c.fwd.i = ig.Clone(), c.fwd.f = fg.Clone();
    d.fwd.q = Gpu(q, dt), d.fwd.k = Gpu(k, dt), d.fwd.v = Gpu(v, dt);
    d.fwd.i = Gpu(ig, DType::kF32), d.fwd.f = Gpu(fg, DType::kF32);
    c.fwd.state_c = c0.Clone(), c.fwd.state_n = n0.Clone(), c.fwd.state_m = m0.Clone();
    d.fwd.state_c = Gpu(c0, DType::kF32), d.fwd.state_n = Gpu(n0, DType::kF32);
    d.fwd.state_m = Gpu(m0, DType::kF32);
    c.d_h = Cpu(d_h, dt), d.d_h = Gpu(d_h, dt);
    if (grads != StateGrads::kNone) c.d_ct = d_ct.Clone(), d.d_ct = Gpu(d_ct, DType::kF32);
    if (grads == StateGrads::kAll) c.d_nt = d_nt.Clone(), d.d_nt = Gpu(d_nt, DType::kF32);
    c.dq = Tensor::Zeros(DType::kF32, {n, H, K}), c.dk = Tensor::Zeros(DType::kF32, {n, H, K});
    c.dv = Tensor::Zeros(DType::kF32, {n, H, V});
    c.di = Tensor::Zeros(DType::kF32, {n, H}), c.df = Tensor::Zeros(DType::kF32, {n, H});
    if (grads != StateGrads::kNone) {
      c.d_c0 = Tensor::Zeros(DType::kF32, {S, H, K, V});
      c.d_n0 = Tensor::Zeros(DType::kF32, {S, H, K});
    }
    // Poisoned: every element must be written.
    d.dq = Gpu(Rand({n, H, K}, 7, 8), dt), d.dk = Gpu(Rand({n, H, K}, 7, 8), dt);
    d.dv = Gpu(Rand({n, H, V}, 7, 8), dt);
    d.di = Gpu(Rand({n, H}, 7, 8), DType::kF32), d.df = Gpu(Rand({n, H}, 7, 8), DType::kF32);
    if (grads != StateGrads::kNone) {
      d.d_c0 = Gpu(Rand({S, H, K, V}, 7, 8), DType::kF32);
      d.d_n0 = Gpu(Rand({S, H, K}, 7, 8), DType::kF32);
    }
    if (kept_forward) {
      // On pools of their own: the forward leaves its final states there.
      MlstmForwardArgs cf = c.fwd, df = d.fwd;
      cf.state_c = c0.Clone(), cf.state_n = n0.Clone(), cf.state_m = m0.Clone();
      df.state_c = Gpu(c0, DType::kF32), df.state_n = Gpu(n0, DType::kF32);
      df.state_m = Gpu(m0, DType::kF32);
      cf.h = Tensor::Zeros(DType::kF32, {n, H, V});
      df.h = Gpu(Rand({n, H, V}, 7, 8), dt);
      cf.norm_dot = Tensor::Zeros(DType::kF32, {n, H});
      df.norm_dot = Gpu(Rand({n, H}, 7, 8), DType::kF32);
      ASSERT_TRUE(cpu_->MlstmForward(batch_, cf, MixerForm::kChunked).ok()) << what;
      const absl::Status fst = gpu_->MlstmForward(batch_, df, MixerForm::kAuto);
      ASSERT_TRUE(fst.ok()) << what << ": " << fst;
      Expect(df.norm_dot, cf.norm_dot, dt == DType::kF32 ? kF32Tol : kBf16Tol,
             what + " forward's q'n");
      d.fwd.h = df.h, d.fwd.norm_dot = df.norm_dot;
    }
    ASSERT_TRUE(cpu_->MlstmBackward(batch_, c).ok());
    const absl::Status st = gpu_->MlstmBackward(batch_, d);
    ASSERT_TRUE(st.ok()) << what << ": " << st;
    ASSERT_TRUE(gpu_->Synchronize().ok()) << what;
    const double gtol = dt == DType::kF32 ? 1e-3 : 5e-2;
    Expect(d.dq, c.dq, gtol, what + " dq");
    Expect(d.dk, c.dk, gtol, what + " dk");
    Expect(d.dv, c.dv, gtol, what + " dv");
    Expect(d.di, c.di, gtol, what + " di");
    Expect(d.df, c.df, gtol, what + " df");
    if (grads == StateGrads::kNone) return;
    Expect(d.d_c0, c.d_c0, gtol, what + " dc0");
    Expect(d.d_n0, c.d_n0, gtol, what + " dn0");
  }
};

constexpr DecayKind kKinds[] = {DecayKind::kNone, DecayKind::kConstant, DecayKind::kScalar,
                                DecayKind::kVector, DecayKind::kLeftRight};

TEST_F(CudaVsCpu, DecayForwardAndBackward) {
  // Head shapes of the tiny models and of the GLA 1.3B layout (key_dim 256).
  for (const std::pair<int, int>& dims : {std::pair{64, 96}, std::pair{256, 192}})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int K = dims.first, V = dims.second;  // named, not bound: lambdas capture them
      const double tol = dt == DType::kF32 ? kF32Tol : kBf16Tol;
      for (DecayKind kind : kKinds) {
        for (bool step : {false, true}) {
          MakeBatch(step ? std::vector<int>{1, 1, 1} : std::vector<int>{70, 1, 0, 33});
          const int64_t n = offsets_.back();
          const int H = 2, S = batch_.num_seqs;
          const std::string what = "K=" + std::to_string(K) + " " + std::string(DTypeName(dt)) +
                                   " kind " + std::to_string(static_cast<int>(kind)) +
                                   (step ? " step" : " chunked");
          DecayPair pair = MakeDecayPair(kind, dt, H, K, V, 0.125f);
          DecayForwardArgs &c = pair.cpu, &d = pair.gpu;
          const Tensor& h0 = pair.h0;
          const Tensor d_o = Rand({n, H, V}, -1, 1), d_ht = Rand({S, H, K, V}, -1, 1);
          const Tensor h0_gpu = Gpu(h0, DType::kF32);

          ASSERT_TRUE(cpu_->DecayForward(batch_, c, MixerForm::kChunked).ok());
          const MixerForm form = step ? MixerForm::kRecurrent : MixerForm::kChunked;
          ASSERT_TRUE(gpu_->DecayForward(batch_, d, form).ok()) << what;
          Expect(d.o, c.o, tol, what + " o");
          Expect(d.state, c.state, tol, what + " final state");
          if (step) continue;

          // Backward from the initial states.
          DecayBackwardArgs cb, db;
          cb.fwd = c, db.fwd = d;
          cb.fwd.state = h0.Clone();
          db.fwd.state = h0_gpu;
          cb.d_o = Cpu(d_o, dt), db.d_o = Gpu(d_o, dt);
          cb.d_ht = d_ht.Clone(), db.d_ht = Gpu(d_ht, DType::kF32);
          auto outs = [&](DecayBackwardArgs& b, bool on_gpu) {
            auto make = [&](const Shape& s, DType t) {
              return on_gpu ? Gpu(Rand(s, 7, 8), t) : Tensor::Zeros(DType::kF32, s);
            };
            b.dq = make({n, H, K}, dt), b.dk = make({n, H, K}, dt), b.dv = make({n, H, V}, dt);
            b.d_log_gamma = make({H}, DType::kF32), b.dg = make({n, H}, DType::kF32);
            b.dgk = make({n, H, K}, DType::kF32), b.dgv = make({n, H, V}, DType::kF32);
            b.dh0 = make({S, H, K, V}, DType::kF32);
          };
          outs(cb, false);
          outs(db, true);
          ASSERT_TRUE(cpu_->DecayBackward(batch_, cb).ok());
          const absl::Status st = gpu_->DecayBackward(batch_, db);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          const double gtol = dt == DType::kF32 ? 1e-3 : 5e-2;
          Expect(db.dq, cb.dq, gtol, what + " dq");
          Expect(db.dk, cb.dk, gtol, what + " dk");
          Expect(db.dv, cb.dv, gtol, what + " dv");
          Expect(db.dh0, cb.dh0, gtol, what + " dh0");
          if (kind == DecayKind::kConstant)
            Expect(db.d_log_gamma, cb.d_log_gamma, gtol, what + " dlg");
          if (kind == DecayKind::kScalar) Expect(db.dg, cb.dg, gtol, what + " dg");
          if (kind == DecayKind::kVector || kind == DecayKind::kLeftRight)
            Expect(db.dgk, cb.dgk, gtol, what + " dgk");
          if (kind == DecayKind::kLeftRight) Expect(db.dgv, cb.dgv, gtol, what + " dgv");
        }
      }
    }
}

TEST_F(CudaVsCpu, GsaForward) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    MakeBatch({70, 1, 0, 33});
    const int64_t n = offsets_.back();
    const int H = 2, K = 64, V = 64, M = 16, S = batch_.num_seqs;
    const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1), v = Rand({n, H, V}, -1, 1);
    const Tensor g = Rand({n, H, M}, -1, -0.01f), s = Rand({n, H, M}, 0, 1);
    const Tensor hk = Rand({S + 1, H, K, M}, -1, 1), hv = Rand({S + 1, H, M, V}, -1, 1);
    GsaForwardArgs c, d;
    for (GsaForwardArgs* a : {&c, &d})
      a->heads = H, a->key_dim = K, a->value_dim = V, a->num_slots_m = M, a->scale = 0.125f;
    c.q = Cpu(q, dt), c.k = Cpu(k, dt), c.v = Cpu(v, dt), c.s = Cpu(s, dt), c.g = g.Clone();
    d.q = Gpu(q, dt), d.k = Gpu(k, dt), d.v = Gpu(v, dt), d.s = Gpu(s, dt),
    d.g = Gpu(g, DType::kF32);
    c.o = Tensor::Zeros(DType::kF32, {n, H, V});
    d.o = Gpu(Rand({n, H, V}, 7, 8), dt);
    c.state_k = hk.Clone(), c.state_v = hv.Clone();
    d.state_k = Gpu(hk, DType::kF32), d.state_v = Gpu(hv, DType::kF32);
    ASSERT_TRUE(cpu_->GsaForward(batch_, c, MixerForm::kChunked).ok());
    ASSERT_TRUE(gpu_->GsaForward(batch_, d, MixerForm::kChunked).ok());
    const double tol = dt == DType::kF32 ? kF32Tol : kBf16Tol;
    Expect(d.o, c.o, tol, "gsa o");
    Expect(d.state_k, c.state_k, tol, "gsa hk");
    Expect(d.state_v, c.state_v, tol, "gsa hv");
  }
}

// From pooled initial states and from zero ones, with every optional
// cotangent and gradient present; ds in the activation dtype on the GPU.
TEST_F(CudaVsCpu, GsaBackward) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (bool zero_init : {false, true}) {
      MakeBatch({70, 1, 0, 33});
      batch_.zero_initial_state = zero_init;
      const int64_t n = offsets_.back();
      const int H = 2, K = 64, V = 64, M = 16, S = batch_.num_seqs;
      const std::string what =
          "gsa backward " + std::string(DTypeName(dt)) + (zero_init ? " zero h0" : "");
      const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                   v = Rand({n, H, V}, -1, 1);
      const Tensor g = Rand({n, H, M}, -1, -0.01f), s = Rand({n, H, M}, 0, 1);
      const Tensor hk = Rand({S + 1, H, K, M}, -1, 1), hv = Rand({S + 1, H, M, V}, -1, 1);
      const Tensor d_o = Rand({n, H, V}, -1, 1);
      const Tensor d_hkt = Rand({S, H, K, M}, -1, 1), d_hvt = Rand({S, H, M, V}, -1, 1);
      GsaBackwardArgs c, d;
      for (GsaBackwardArgs* b : {&c, &d}) {
        b->fwd.heads = H, b->fwd.key_dim = K, b->fwd.value_dim = V, b->fwd.num_slots_m = M;
        b->fwd.scale = 0.125f;
      }
      c.fwd.q = Cpu(q, dt), c.fwd.k = Cpu(k, dt), c.fwd.v = Cpu(v, dt), c.fwd.s = Cpu(s, dt),
      c.fwd.g = g.Clone();
      d.fwd.q = Gpu(q, dt), d.fwd.k = Gpu(k, dt), d.fwd.v = Gpu(v, dt), d.fwd.s = Gpu(s, dt);
      d.fwd.g = Gpu(g, DType::kF32);
      c.fwd.state_k = hk.Clone(), c.fwd.state_v = hv.Clone();
      d.fwd.state_k = Gpu(hk, DType::kF32), d.fwd.state_v = Gpu(hv, DType::kF32);
      c.d_o = Cpu(d_o, dt), d.d_o = Gpu(d_o, dt);
      c.d_hkt = d_hkt.Clone(), c.d_hvt = d_hvt.Clone();
      d.d_hkt = Gpu(d_hkt, DType::kF32), d.d_hvt = Gpu(d_hvt, DType::kF32);
      c.dq = Tensor::Zeros(DType::kF32, {n, H, K}), c.dk = Tensor::Zeros(DType::kF32, {n, H, K});
      c.dv = Tensor::Zeros(DType::kF32, {n, H, V});
      c.ds = Tensor::Zeros(DType::kF32, {n, H, M}), c.dg = Tensor::Zeros(DType::kF32, {n, H, M});
      c.d_hk0 = Tensor::Zeros(DType::kF32, {S, H, K, M}),
      c.d_hv0 = Tensor::Zeros(DType::kF32, {S, H, M, V});
      // Poisoned: every element must be written.
      d.dq = Gpu(Rand({n, H, K}, 7, 8), dt), d.dk = Gpu(Rand({n, H, K}, 7, 8), dt);
      d.dv = Gpu(Rand({n, H, V}, 7, 8), dt), d.ds = Gpu(Rand({n, H, M}, 7, 8), dt);
      d.dg = Gpu(Rand({n, H, M}, 7, 8), DType::kF32);
      d.d_hk0 = Gpu(Rand({S, H, K, M}, 7, 8), DType::kF32),
      d.d_hv0 = Gpu(Rand({S, H, M, V}, 7, 8), DType::kF32);
      const Tensor hk_before = Down(d.fwd.state_k), hv_before = Down(d.fwd.state_v);
      ASSERT_TRUE(cpu_->GsaBackward(batch_, c).ok());
      const absl::Status st = gpu_->GsaBackward(batch_, d);
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      const double gtol = dt == DType::kF32 ? 1e-3 : 5e-2;
      Expect(d.dq, c.dq, gtol, what + " dq");
      Expect(d.dk, c.dk, gtol, what + " dk");
      Expect(d.dv, c.dv, gtol, what + " dv");
      Expect(d.ds, c.ds, gtol, what + " ds");
      Expect(d.dg, c.dg, gtol, what + " dg");
      Expect(d.d_hk0, c.d_hk0, gtol, what + " dhk0");
      Expect(d.d_hv0, c.d_hv0, gtol, what + " dhv0");
      // The pools are inputs only.
      Expect(d.fwd.state_k, hk_before, 0.0, what + " state_k untouched");
      Expect(d.fwd.state_v, hv_before, 0.0, what + " state_v untouched");
    }
  }
}

// Chunked, a step of three sequences, and one of 600 (a launch of several
// waves, whose rows kernels/cuda/step.cu stages in shared memory).
TEST_F(CudaVsCpu, MlstmForward) {
  const std::vector<int> chunked{70, 1, 0, 33}, few{1, 1, 1}, many(600, 1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (MlstmKind kind : {MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm}) {
      for (const std::vector<int>* lens : {&chunked, &few, &many}) {
        MakeBatch(*lens);
        const bool step = lens != &chunked;
        const int64_t n = offsets_.back();
        const int H = 2, K = 64, V = 64, S = batch_.num_seqs;
        const std::string what = "mlstm kind " + std::to_string(static_cast<int>(kind)) +
                                 (step ? " step of " + std::to_string(S) + " " : " chunked ") +
                                 std::string(DTypeName(dt));
        const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                     v = Rand({n, H, V}, -1, 1);
        const Tensor ig = Rand({n, H}, -3, 3), fg = Rand({n, H}, -1, 5);
        const Tensor c0 = Rand({S + 1, H, K, V}, -1, 1), n0 = Rand({S + 1, H, K}, -1, 1);
        const Tensor m0 = Rand({S + 1, H}, -1, 1);
        MlstmForwardArgs c, d;
        for (MlstmForwardArgs* a : {&c, &d})
          a->kind = kind, a->heads = H, a->key_dim = K, a->value_dim = V;
        c.q = Cpu(q, dt), c.k = Cpu(k, dt), c.v = Cpu(v, dt), c.i = ig.Clone(), c.f = fg.Clone();
        d.q = Gpu(q, dt), d.k = Gpu(k, dt), d.v = Gpu(v, dt), d.i = Gpu(ig, DType::kF32),
        d.f = Gpu(fg, DType::kF32);
        c.h = Tensor::Zeros(DType::kF32, {n, H, V});
        d.h = Gpu(Rand({n, H, V}, 7, 8), dt);
        c.state_c = c0.Clone(), c.state_n = n0.Clone(), c.state_m = m0.Clone();
        d.state_c = Gpu(c0, DType::kF32), d.state_n = Gpu(n0, DType::kF32),
        d.state_m = Gpu(m0, DType::kF32);
        ASSERT_TRUE(cpu_->MlstmForward(batch_, c, MixerForm::kChunked).ok());
        const absl::Status st =
            gpu_->MlstmForward(batch_, d, step ? MixerForm::kRecurrent : MixerForm::kChunked);
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        const double tol = dt == DType::kF32 ? kF32Tol : kBf16Tol;
        Expect(d.h, c.h, tol, what + " h");
        Expect(d.state_c, c.state_c, tol, what + " c");
        Expect(d.state_n, c.state_n, tol, what + " n");
        if (kind == MlstmKind::kExp) Expect(d.state_m, c.state_m, tol, what + " m");
      }
    }
  }
}

// Every kind, both dtypes, two shapes (the larger one needs more than 48 KiB
// of shared memory), pooled and zero initial states, every cotangent present.
TEST_F(CudaVsCpu, MlstmBackward) {
  struct Dims {
    int key_dim, value_dim;
  };
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (MlstmKind kind : {MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm}) {
      for (Dims dims : {Dims{64, 48}, Dims{128, 128}}) {
        for (bool zero_init : {false, true}) {
          MakeBatch({70, 1, 0, 33});
          batch_.zero_initial_state = zero_init;
          const int K = dims.key_dim, V = dims.value_dim;
          const std::string what = "mlstm backward kind " + std::to_string(static_cast<int>(kind)) +
                                   " K" + std::to_string(K) + " V" + std::to_string(V) + " " +
                                   std::string(DTypeName(dt)) + (zero_init ? " zero h0" : "");
          CompareMlstmBackward(kind, dt, K, V, -1, 5, what);
        }
      }
    }
  }
}

// Without a cotangent on the normalizer state the sigmoid kind takes the
// decay family's scans (cuda_backend.cc, MlstmSigBackward), and the
// normalized kinds (exp, and sig with its normalizer) take the tensor-core
// scans, q'·n's share as one more key feature, from zero states without state
// cotangents and with bf16 operands (MlstmNormBackward): every kind under
// both kinds of state gradients, short and several-chunk sequences.
TEST_F(CudaVsCpu, MlstmBackwardWithoutNormalizerCotangent) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (MlstmKind kind : {MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm})
      for (StateGrads grads : {StateGrads::kCellOnly, StateGrads::kNone})
        for (bool zero_init : {false, true}) {
          MakeBatch({70, 1, 0, 33, 300});
          batch_.zero_initial_state = zero_init;
          const std::string what = "mlstm backward kind " + std::to_string(static_cast<int>(kind)) +
                                   " " + std::string(DTypeName(dt)) +
                                   (zero_init ? " zero h0" : "") +
                                   (grads == StateGrads::kNone ? " no state grads" : " d_ct");
          CompareMlstmBackward(kind, dt, 128, 128, -1, 5, what, grads);
        }
}

// A training forward keeps h and q'ᵀn for the normalized kinds, and the
// backward reads them instead of running the forward again (the scans' paths
// from zero states; the mLSTM kernel's, with state cotangents, ignores
// them): against the CPU's backward, which runs its own recurrence.
TEST_F(CudaVsCpu, MlstmBackwardReadsTheKeptForward) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (MlstmKind kind : {MlstmKind::kExp, MlstmKind::kSigNorm})
      for (StateGrads grads : {StateGrads::kAll, StateGrads::kNone}) {
        MakeBatch({70, 1, 0, 33, 300});
        batch_.zero_initial_state = grads == StateGrads::kNone;
        const std::string what = "kept forward, kind " + std::to_string(static_cast<int>(kind)) +
                                 " " + std::string(DTypeName(dt)) +
                                 (grads == StateGrads::kNone ? " zero h0, no state grads" : "");
        CompareMlstmBackward(kind, dt, 128, 128, -1, 5, what, grads, /*kept_forward=*/true);
      }
}

// Long packed sequences (several chunks of 64 and thousands of tokens, ragged
// ends), every kind: from pooled initial states with every state cotangent
// (the mLSTM kernel), and from zero states without them (bf16: the scans).
TEST_F(CudaVsCpu, MlstmBackwardLongPacked) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (MlstmKind kind : {MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm}) {
      for (StateGrads grads : {StateGrads::kAll, StateGrads::kNone}) {
        MakeBatch({3000, 65, 1, 0, 517});
        batch_.zero_initial_state = grads == StateGrads::kNone;
        const std::string what =
            "long mlstm backward kind " + std::to_string(static_cast<int>(kind)) + " " +
            std::string(DTypeName(dt)) + (grads == StateGrads::kNone ? " zero states" : "");
        CompareMlstmBackward(kind, dt, 64, 64, 0, 6, what, grads);
      }
    }
  }
}

TEST_F(CudaVsCpu, MlstmBackwardRejectsWideHeads) {
  MakeBatch({3});
  const int64_t n = offsets_.back();
  const int H = 1, K = 64, V = 160;
  MlstmBackwardArgs d;
  d.fwd.kind = MlstmKind::kSig, d.fwd.heads = H, d.fwd.key_dim = K, d.fwd.value_dim = V;
  d.fwd.q = Gpu(Rand({n, H, K}, -1, 1), DType::kF32),
  d.fwd.k = Gpu(Rand({n, H, K}, -1, 1), DType::kF32);
  d.fwd.v = Gpu(Rand({n, H, V}, -1, 1), DType::kF32);
  d.fwd.i = Gpu(Rand({n, H}, -1, 1), DType::kF32), d.fwd.f = Gpu(Rand({n, H}, -1, 1), DType::kF32);
  d.fwd.state_c = Gpu(Rand({2, H, K, V}, -1, 1), DType::kF32);
  d.fwd.state_n = Gpu(Rand({2, H, K}, -1, 1), DType::kF32);
  d.d_h = Gpu(Rand({n, H, V}, -1, 1), DType::kF32);
  d.dq = Gpu(Rand({n, H, K}, 0, 1), DType::kF32), d.dk = Gpu(Rand({n, H, K}, 0, 1), DType::kF32);
  d.dv = Gpu(Rand({n, H, V}, 0, 1), DType::kF32);
  d.di = Gpu(Rand({n, H}, 0, 1), DType::kF32), d.df = Gpu(Rand({n, H}, 0, 1), DType::kF32);
  const absl::Status st = gpu_->MlstmBackward(batch_, d);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(std::string(st.message()).find("value_dim"), std::string::npos) << st;
}

// Steps over 64 sequences (a launch of under a wave, whose rows
// kernels/cuda/step.cu holds in registers: a step of three sequences takes
// its 8-column CTAs instead) and over 600 (several waves, rows staged in
// shared memory): key widths of the narrow instances (64) and of the wide
// ones (200, 256); pooled and zero initial states.
TEST_F(CudaVsCpu, DecayStepOverManySequences) {
  const int H = 2, V = 64;
  for (int sequences : {64, 600}) {
    MakeBatch(std::vector<int>(sequences, 1));
    for (int K : {64, 200, 256}) {
      for (DecayKind kind : {DecayKind::kScalar, DecayKind::kVector, DecayKind::kLeftRight}) {
        for (bool zero_init : {false, true}) {
          batch_.zero_initial_state = zero_init;
          const std::string what =
              std::to_string(sequences) + " sequences, K=" + std::to_string(K) + " kind " +
              std::to_string(static_cast<int>(kind)) + (zero_init ? " from zero" : " pooled");
          DecayPair pair = MakeDecayPair(kind, DType::kBF16, H, K, V, 0.125f);
          DecayForwardArgs &c = pair.cpu, &d = pair.gpu;
          ASSERT_TRUE(cpu_->DecayForward(batch_, c, MixerForm::kChunked).ok());
          const absl::Status st = gpu_->DecayForward(batch_, d, MixerForm::kRecurrent);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          Expect(d.o, c.o, kBf16Tol, what + " o");
          Expect(d.state, c.state, kBf16Tol, what + " final state");
        }
      }
    }
  }
}

// GLA's gate from its low-rank input, gk = scale · log σ(z · wᵀ + bias),
// formed by the decode step itself (FormsLowRankGate): against the CPU's
// step on gk formed on the host from the same 16-bit weights, for launches
// of 8-column CTAs (one sequence) and of held rows (64 sequences, on GPUs
// of 64 SMs or more), ranks 16 and 32, with and without a bias. Launches
// that stage their rows (600 sequences), batches with a longer sequence and
// the chunked form are refused.
TEST_F(CudaVsCpu, DecayStepFormsLowRankGate) {
  const int H = 2, V = 64;
  for (int sequences : {1, 64, 600}) {
    MakeBatch(std::vector<int>(sequences, 1));
    const int64_t n = sequences;
    for (int K : {64, 256}) {
      for (int rank : {16, 32}) {
        for (bool bias : {false, true}) {
          const std::string what = std::to_string(sequences) +
                                   " sequences, K=" + std::to_string(K) + " rank " +
                                   std::to_string(rank) + (bias ? " bias" : "");
          DecayPair pair = MakeDecayPair(DecayKind::kVector, DType::kBF16, H, K, V, 0.125f);
          DecayForwardArgs &c = pair.cpu, &d = pair.gpu;
          const Tensor z = Rand({n, rank}, -1, 1), w = Rand({int64_t{H} * K, rank}, -1, 1);
          const Tensor b = Rand({int64_t{H} * K}, -1, 1);
          const Tensor w_rounded = Cpu(w, DType::kBF16);
          const float scale = 1.0f / 16.0f;
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t row = 0; row < int64_t{H} * K; ++row) {
              double y = bias ? b.f32()[row] : 0.0;
              for (int r = 0; r < rank; ++r)
                y += double{z.f32()[t * rank + r]} * w_rounded.f32()[row * rank + r];
              const double log_sigmoid = std::min(y, 0.0) - std::log1p(std::exp(-std::abs(y)));
              c.gk.f32()[t * H * K + row] = static_cast<float>(scale * log_sigmoid);
            }
          }
          d.gk = Tensor();
          d.gk_low_rank = {Gpu(z, DType::kF32), Gpu(w, DType::kBF16),
                           bias ? Gpu(b, DType::kF32) : Tensor(), scale};
          EXPECT_FALSE(gpu_->FormsLowRankGate(batch_, d, MixerForm::kChunked)) << what;
          const bool forms = gpu_->FormsLowRankGate(batch_, d, MixerForm::kAuto);
          if (sequences == 1) {
            ASSERT_TRUE(forms) << what;
          }
          if (sequences == 600) {
            EXPECT_FALSE(forms) << what;
          }
          if (!forms) {
            EXPECT_EQ(gpu_->DecayForward(batch_, d, MixerForm::kAuto).code(),
                      absl::StatusCode::kInvalidArgument)
                << what;
            continue;
          }
          ASSERT_TRUE(cpu_->DecayForward(batch_, c, MixerForm::kRecurrent).ok());
          const absl::Status st = gpu_->DecayForward(batch_, d, MixerForm::kAuto);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          Expect(d.o, c.o, kBf16Tol, what + " o");
          Expect(d.state, c.state, kF32Tol, what + " final state");
        }
      }
    }
  }
  MakeBatch({1, 2});
  DecayPair pair = MakeDecayPair(DecayKind::kVector, DType::kBF16, H, 64, V, 0.125f);
  pair.gpu.gk_low_rank = {Gpu(Rand({3, 16}, -1, 1), DType::kF32),
                          Gpu(Rand({H * 64, 16}, -1, 1), DType::kBF16), Tensor(), 1.0f};
  EXPECT_FALSE(gpu_->FormsLowRankGate(batch_, pair.gpu, MixerForm::kAuto));
  EXPECT_EQ(gpu_->DecayForward(batch_, pair.gpu, MixerForm::kAuto).code(),
            absl::StatusCode::kInvalidArgument);
}

// Keys wider than one scan tile (GSA 1.3B's 512) run in row blocks whose
// partial outputs add: every decay kind, chunked and the one-token step (of
// three sequences, and of 300: a launch of several waves), f32 and bf16,
// against the CPU; the backward still refuses them by name.
TEST_F(CudaVsCpu, DecayForwardWideKeys) {
  const int H = 2, K = 512, V = 128;
  const std::vector<int> chunked{70, 1, 0, 33}, few{1, 1, 1}, many(300, 1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (DecayKind kind : kKinds) {
      for (const std::vector<int>* lens : {&chunked, &few, &many}) {
        MakeBatch(*lens);
        const bool step = lens != &chunked;
        const std::string what = std::string(DTypeName(dt)) + " kind " +
                                 std::to_string(static_cast<int>(kind)) +
                                 (step ? " step of " + std::to_string(lens->size()) : " chunked");
        DecayPair pair = MakeDecayPair(kind, dt, H, K, V, 0.0625f);
        DecayForwardArgs &c = pair.cpu, &d = pair.gpu;
        ASSERT_TRUE(cpu_->DecayForward(batch_, c, MixerForm::kChunked).ok());
        const absl::Status st =
            gpu_->DecayForward(batch_, d, step ? MixerForm::kRecurrent : MixerForm::kChunked);
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        const double tol = dt == DType::kF32 ? kF32Tol : kBf16Tol;
        Expect(d.o, c.o, tol, what + " o");
        Expect(d.state, c.state, tol, what + " final state");
        if (step || kind != DecayKind::kVector) continue;
        DecayBackwardArgs b;
        b.fwd = d;
        b.d_o = d.o, b.dq = d.q, b.dk = d.k, b.dv = d.v;
        const absl::Status back = gpu_->DecayBackward(batch_, b);
        EXPECT_TRUE(absl::IsInvalidArgument(back)) << back;
      }
    }
  }
}

// GSA 1.3B's head shape (key_dim 512, 64 slots), chunked prefill and decode steps.
TEST_F(CudaVsCpu, GsaForwardWideKeys) {
  const int H = 2, K = 512, V = 128, M = 64;
  for (bool step : {false, true}) {
    MakeBatch(step ? std::vector<int>{1, 1, 1} : std::vector<int>{70, 1, 0, 33});
    const int64_t n = offsets_.back();
    const int S = batch_.num_seqs;
    const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1), v = Rand({n, H, V}, -1, 1);
    const Tensor g = Rand({n, H, M}, -1, -0.01f), s = Rand({n, H, M}, 0, 1);
    const Tensor hk = Rand({S + 1, H, K, M}, -1, 1), hv = Rand({S + 1, H, M, V}, -1, 1);
    GsaForwardArgs c, d;
    for (GsaForwardArgs* a : {&c, &d})
      a->heads = H, a->key_dim = K, a->value_dim = V, a->num_slots_m = M, a->scale = 0.0625f;
    c.q = q.Clone(), c.k = k.Clone(), c.v = v.Clone(), c.s = s.Clone(), c.g = g.Clone();
    d.q = Gpu(q, DType::kF32), d.k = Gpu(k, DType::kF32), d.v = Gpu(v, DType::kF32);
    d.s = Gpu(s, DType::kF32), d.g = Gpu(g, DType::kF32);
    c.o = Tensor::Zeros(DType::kF32, {n, H, V});
    d.o = Gpu(Rand({n, H, V}, 7, 8), DType::kF32);
    c.state_k = hk.Clone(), c.state_v = hv.Clone();
    d.state_k = Gpu(hk, DType::kF32), d.state_v = Gpu(hv, DType::kF32);
    ASSERT_TRUE(cpu_->GsaForward(batch_, c, MixerForm::kChunked).ok());
    const absl::Status st =
        gpu_->GsaForward(batch_, d, step ? MixerForm::kRecurrent : MixerForm::kChunked);
    ASSERT_TRUE(st.ok()) << st;
    const std::string what = step ? "gsa wide step" : "gsa wide chunked";
    Expect(d.o, c.o, kF32Tol, what + " o");
    Expect(d.state_k, c.state_k, kF32Tol, what + " hk");
    Expect(d.state_v, c.state_v, kF32Tol, what + " hv");
  }
}

// GemmMode::kFast rounds fp32 scan operands to bf16 for the tensor cores:
// multi-token scans then agree with the fp32 reference at the bf16
// tolerance, and one-token steps stay exact.
TEST_F(CudaVsCpu, FastModeScansRoundForTensorCores) {
  BackendOptions options;
  options.gemm = GemmMode::kFast;
  absl::StatusOr<std::unique_ptr<Backend>> fast = MakeBackend("cuda", options);
  ASSERT_TRUE(fast.ok()) << fast.status();
  auto up = [&](const Tensor& host) {
    absl::StatusOr<Tensor> t = (*fast)->Upload(host, DType::kF32);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  };
  auto err = [&](const Tensor& device, const Tensor& ref) {
    absl::StatusOr<Tensor> t = (*fast)->Download(device);
    EXPECT_TRUE(t.ok()) << t.status();
    return RelativeError(*t, ref);
  };
  const int H = 2, K = 128, V = 128;
  for (bool step : {false, true}) {
    MakeBatch(step ? std::vector<int>{1, 1, 1} : std::vector<int>{200, 1, 0, 65});
    const int64_t n = offsets_.back();
    const int S = batch_.num_seqs;
    const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1), v = Rand({n, H, V}, -1, 1);
    const Tensor gk = Rand({n, H, K}, -1, -0.01f), h0 = Rand({S + 1, H, K, V}, -1, 1);
    const Tensor ig = Rand({n, H}, -3, 3), fg = Rand({n, H}, -1, 5),
                 n0 = Rand({S + 1, H, K}, -1, 1);
    const Tensor m0 = Rand({S + 1, H}, -1, 1);
    const MixerForm form = step ? MixerForm::kRecurrent : MixerForm::kChunked;
    const double tol = step ? kF32Tol : kBf16Tol;
    const std::string what = step ? "fast step" : "fast chunked";

    DecayForwardArgs c, d;
    for (DecayForwardArgs* a : {&c, &d})
      a->kind = DecayKind::kVector, a->heads = H, a->key_dim = K, a->value_dim = V,
      a->scale = 0.09f;
    c.q = q.Clone(), c.k = k.Clone(), c.v = v.Clone(), c.gk = gk.Clone(), c.state = h0.Clone();
    c.o = Tensor::Zeros(DType::kF32, {n, H, V});
    d.q = up(q), d.k = up(k), d.v = up(v), d.gk = up(gk), d.state = up(h0),
    d.o = up(Rand({n, H, V}, 7, 8));
    ASSERT_TRUE(cpu_->DecayForward(batch_, c, MixerForm::kChunked).ok());
    ASSERT_TRUE((*fast)->DecayForward(batch_, d, form).ok());
    EXPECT_LE(err(d.o, c.o), tol) << what << " decay o";
    EXPECT_LE(err(d.state, c.state), tol) << what << " decay state";

    MlstmForwardArgs mc, md;
    for (MlstmForwardArgs* a : {&mc, &md})
      a->kind = MlstmKind::kExp, a->heads = H, a->key_dim = K, a->value_dim = V;
    mc.q = q.Clone(), mc.k = k.Clone(), mc.v = v.Clone(), mc.i = ig.Clone(), mc.f = fg.Clone();
    mc.h = Tensor::Zeros(DType::kF32, {n, H, V});
    mc.state_c = h0.Clone(), mc.state_n = n0.Clone(), mc.state_m = m0.Clone();
    md.q = up(q), md.k = up(k), md.v = up(v), md.i = up(ig), md.f = up(fg),
    md.h = up(Rand({n, H, V}, 7, 8));
    md.state_c = up(h0), md.state_n = up(n0), md.state_m = up(m0);
    ASSERT_TRUE(cpu_->MlstmForward(batch_, mc, MixerForm::kChunked).ok());
    ASSERT_TRUE((*fast)->MlstmForward(batch_, md, form).ok());
    EXPECT_LE(err(md.h, mc.h), tol) << what << " mlstm h";
    EXPECT_LE(err(md.state_c, mc.state_c), tol) << what << " mlstm c";
  }
}

// Every op of the golden fixtures, f32 and bf16, forward and backward; a
// bf16 check that rounding the inputs alone misses is judged against the
// CPU's exact result on the same rounded inputs (AddRoundingFloor).
TEST_F(CudaVsCpu, GoldenFixtures) {
  const char* env = std::getenv("LAIR_FIXTURES");
  const std::string dir = std::string(env ? env : LAIR_DEFAULT_FIXTURES_DIR) + "/ops";
  absl::StatusOr<std::vector<OpSpec>> ops = ReadOpsManifest(dir);
  if (!ops.ok()) GTEST_SKIP() << "no ops fixtures at " << dir << ": " << ops.status().message();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    VerifyOpsOptions options;
    options.dtype = dt;
    for (const OpSpec& spec : *ops) {
      OpReport report = VerifyOp(*gpu_, dir, spec, options);
      AddRoundingFloor(*cpu_, dir, options, report);
      for (const TensorCheck& c : report.checks) {
        std::printf("fixture %s %s %-28s %.3g (tol %.0e) %s\n", std::string(DTypeName(dt)).c_str(),
                    spec.name.c_str(), c.label.c_str(), c.relative_error, c.tolerance,
                    c.at_floor() ? "ok at the rounding floor"
                    : c.passed() ? "ok"
                                 : "FAIL");
        EXPECT_TRUE(c.passed()) << spec.name << " " << c.label;
      }
      if (!report.status.ok())
        std::printf("fixture %s %s status: %s\n", std::string(DTypeName(dt)).c_str(),
                    spec.name.c_str(), std::string(report.status.message()).c_str());
      EXPECT_TRUE(report.status.ok()) << spec.name << ": " << report.status;
    }
  }
}

}  // namespace
}  // namespace lair::kernels
