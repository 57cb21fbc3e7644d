// The tensor-core scans (kernels/cuda/scan_mma.cu; on sm_90, scan_wgmma.cu for
// bf16 scans at 128 keys with scalar or no decay, forward and reverse, mLSTM's
// included: K = 128 here), reached through CudaBackend with bf16 and f16 inputs, against CpuBackend
// fed the same rounded inputs: log-decays down to −20 per step (the diagonal blocks' exact
// fallback; the fp32 path overflows there), lengths off the 64-token chunk, packed sequences with
// initial states from shuffled slots, several dv tiles (128 wide for dk ≤ 128, 64 above; a partial
// last one), key_dim 256, right decays (GSA's key pass and the decay backward's dq and dk scans),
// the reverse scans of the backward, and mLSTM; the forward in every schedule (one pass; the state
// pass then the chunk-parallel output pass; segments carried, with the entry term at 128 keys and
// more and a state pass below). Skips without a GPU.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels_cuda/cuda_vs_cpu.h"

namespace lair::kernels {
namespace {

constexpr double kTol = 2e-2;  // bf16/f16 inputs, fixtures README
constexpr double kGradTol = 5e-2;

class MmaScanVsCpu : public CudaVsCpuTest {
 protected:
  MmaScanVsCpu() : CudaVsCpuTest(11) {}
};

// The forward under a forced schedule.
class MmaScanScheduleVsCpu : public CudaVsCpuTest,
                             public ::testing::WithParamInterface<ScanSchedule> {
 protected:
  MmaScanScheduleVsCpu() : CudaVsCpuTest(11) { gpu_options_.scan = GetParam(); }
};

struct DecayRange {
  float lo, hi;
  const char* name;
};
// Mild (every diagonal block by mma), mixed (some blocks past the e^60 span),
// strong (all of them exact; the fp32 path overflows).
constexpr DecayRange kRanges[] = {
    {-0.3f, -0.01f, "mild"}, {-5.0f, -0.5f, "mixed"}, {-20.0f, -5.0f, "strong"}};

TEST_P(MmaScanScheduleVsCpu, DecayForward) {
  for (const auto& [K, V] : {std::pair{128, 128}, std::pair{128, 192}, std::pair{64, 96},
                             std::pair{64, 256}, std::pair{256, 192}, std::pair{128, 80}})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (DecayKind kind :
           {DecayKind::kNone, DecayKind::kConstant, DecayKind::kScalar, DecayKind::kVector})
        for (const DecayRange& range : kRanges) {
          if (dt == DType::kF16 && K == 256) continue;
          MakeBatch({130, 1, 0, 64, 200, 37});
          const int64_t n = offsets_.back();
          const int H = 2, S = batch_.num_seqs;
          const std::string what = "K=" + std::to_string(K) + " V=" + std::to_string(V) + " " +
                                   std::string(DTypeName(dt)) + " kind " +
                                   std::to_string(static_cast<int>(kind)) + " " + range.name;
          const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                       v = Rand({n, H, V}, -1, 1);
          const Tensor lg = Rand({H}, range.lo, range.hi), g = Rand({n, H}, range.lo, range.hi);
          const Tensor gk = Rand({n, H, K}, range.lo, range.hi);
          const Tensor h0 = Rand({S + 1, H, K, V}, -1, 1);
          DecayForwardArgs c, d;
          for (DecayForwardArgs* a : {&c, &d}) {
            a->kind = kind;
            a->heads = H, a->key_dim = K, a->value_dim = V,
            a->scale = 1.0f / std::sqrt(static_cast<float>(K));
          }
          c.q = Cpu(q, dt), c.k = Cpu(k, dt), c.v = Cpu(v, dt);
          d.q = Gpu(q, dt), d.k = Gpu(k, dt), d.v = Gpu(v, dt);
          c.log_gamma = lg.Clone(), c.g = g.Clone(), c.gk = gk.Clone();
          d.log_gamma = Gpu(lg, DType::kF32), d.g = Gpu(g, DType::kF32),
          d.gk = Gpu(gk, DType::kF32);
          c.o = Tensor::Zeros(DType::kF32, {n, H, V});
          d.o = Gpu(Rand({n, H, V}, 7, 8), dt);  // poisoned: every element must be written
          c.state = h0.Clone();
          d.state = Gpu(h0, DType::kF32);
          ASSERT_TRUE(cpu_->DecayForward(batch_, c, MixerForm::kChunked).ok()) << what;
          const absl::Status st = gpu_->DecayForward(batch_, d, MixerForm::kChunked);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          Expect(d.o, c.o, kTol, what + " o");
          Expect(d.state, c.state, kTol, what + " final state");
        }
}

// GSA: the key pass is the right-decay scan (the slots on the value side, in
// one or two 64-column tiles), the value pass the left vector one, queried by
// probabilities rounded to bf16; 512 keys split into blocks.
TEST_P(MmaScanScheduleVsCpu, GsaForward) {
  for (const auto& [K, M, V] :
       {std::tuple{128, 64, 128}, std::tuple{64, 128, 64}, std::tuple{512, 32, 64}})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (const DecayRange& range : kRanges) {
        MakeBatch({130, 1, 0, 64, 200, 37});
        const int64_t n = offsets_.back();
        const int H = 2, S = batch_.num_seqs;
        const std::string what = "gsa K=" + std::to_string(K) + " M=" + std::to_string(M) + " " +
                                 std::string(DTypeName(dt)) + " " + range.name;
        const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                     v = Rand({n, H, V}, -1, 1);
        const Tensor g = Rand({n, H, M}, range.lo, range.hi), s = Rand({n, H, M}, 0, 1);
        const Tensor hk = Rand({S + 1, H, K, M}, -1, 1), hv = Rand({S + 1, H, M, V}, -1, 1);
        GsaForwardArgs c, d;
        for (GsaForwardArgs* a : {&c, &d})
          a->heads = H, a->key_dim = K, a->value_dim = V, a->num_slots_m = M,
          a->scale = 1.0f / std::sqrt(static_cast<float>(K));
        c.q = Cpu(q, dt), c.k = Cpu(k, dt), c.v = Cpu(v, dt), c.s = Cpu(s, dt), c.g = g.Clone();
        d.q = Gpu(q, dt), d.k = Gpu(k, dt), d.v = Gpu(v, dt), d.s = Gpu(s, dt),
        d.g = Gpu(g, DType::kF32);
        c.o = Tensor::Zeros(DType::kF32, {n, H, V});
        d.o = Gpu(Rand({n, H, V}, 7, 8), dt);  // poisoned: every element must be written
        c.state_k = hk.Clone(), c.state_v = hv.Clone();
        d.state_k = Gpu(hk, DType::kF32), d.state_v = Gpu(hv, DType::kF32);
        ASSERT_TRUE(cpu_->GsaForward(batch_, c, MixerForm::kChunked).ok()) << what;
        const absl::Status st = gpu_->GsaForward(batch_, d, MixerForm::kChunked);
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        Expect(d.o, c.o, kTol, what + " o");
        Expect(d.state_k, c.state_k, kTol, what + " hk");
        Expect(d.state_v, c.state_v, kTol, what + " hv");
      }
}

// Segmented: the sequences cut into segments of whole chunks (when forced,
// as many as fill the GPU: every chunk its own segment here), so the 0- and
// 1-token sequences and the states carried across every chunk boundary are
// covered.
INSTANTIATE_TEST_SUITE_P(Schedules, MmaScanScheduleVsCpu,
                         ::testing::Values(ScanSchedule::kOnePass, ScanSchedule::kTwoPass,
                                           ScanSchedule::kSegmented),
                         [](const ::testing::TestParamInfo<ScanSchedule>& info) {
                           return info.param == ScanSchedule::kOnePass   ? "OnePass"
                                  : info.param == ScanSchedule::kTwoPass ? "TwoPass"
                                                                         : "Segmented";
                         });

// The schedules on a prefill-like launch (one sequence of 1000 tokens, two
// heads). Two passes: at 64 keys both make the same products in the same
// order, so they agree exactly; at 256 keys both split the keys into blocks
// (the one-pass scan four of 64, the output pass two of 128), each rounding
// its part of A to bf16, so they agree to that rounding. Segmented: the
// states entering the segments are sums in another order (fp32 rounding);
// at 64 keys each chunk rounds its S to bf16 from them, at 256 the entry
// term rounds each segment's once and adds its product to outputs scanned
// from zero. At 256 keys with scalar decay on sm_90 the segments' blocks of
// 128 run the wgmma scan, which rounds the state update's V̂ to bf16 where
// the mma.sync scan (the one pass's blocks of 64) rounds K̂: their final
// states then agree to that rounding.
TEST_F(MmaScanVsCpu, SchedulesMatchOnePass) {
  absl::StatusOr<std::unique_ptr<Backend>> one = MakeBackend("cuda", {{}, ScanSchedule::kOnePass});
  absl::StatusOr<std::unique_ptr<Backend>> two = MakeBackend("cuda", {{}, ScanSchedule::kTwoPass});
  absl::StatusOr<std::unique_ptr<Backend>> seg =
      MakeBackend("cuda", {{}, ScanSchedule::kSegmented});
  ASSERT_TRUE(one.ok() && two.ok() && seg.ok());
  for (const auto& [K, tol] : {std::pair{64, 0.0}, std::pair{256, 1e-2}})
    for (DecayKind kind : {DecayKind::kScalar, DecayKind::kVector}) {
      MakeBatch({1000});
      const int64_t n = offsets_.back();
      const int H = 2, V = 192;
      const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                   v = Rand({n, H, V}, -1, 1);
      const Tensor g = Rand({n, H}, -0.3f, -0.01f), gk = Rand({n, H, K}, -0.3f, -0.01f);
      const Tensor h0 = Rand({2, H, K, V}, -1, 1);
      Tensor outs[3], states[3];
      for (int i = 0; i < 3; ++i) {
        Backend& b = i == 0 ? **one : i == 1 ? **two : **seg;
        DecayForwardArgs a;
        a.kind = kind, a.heads = H, a.key_dim = K, a.value_dim = V, a.scale = 0.0625f;
        a.q = *b.Upload(q, DType::kBF16), a.k = *b.Upload(k, DType::kBF16);
        a.v = *b.Upload(v, DType::kBF16);
        a.g = *b.Upload(g, DType::kF32), a.gk = *b.Upload(gk, DType::kF32);
        a.o = *b.Upload(Rand({n, H, V}, 7, 8), DType::kF32);
        a.state = *b.Upload(h0, DType::kF32);
        const absl::Status st = b.DecayForward(batch_, a, MixerForm::kChunked);
        ASSERT_TRUE(st.ok()) << st;
        outs[i] = b.Download(a.o)->ToF32();
        states[i] = b.Download(a.state)->ToF32();
      }
      const std::string what =
          "K=" + std::to_string(K) + " kind " + std::to_string(static_cast<int>(kind));
      EXPECT_LE(RelativeError(outs[1], outs[0]), tol) << what << " two-pass o";
      EXPECT_EQ(RelativeError(states[1], states[0]), 0.0) << what << " two-pass final state";
      EXPECT_LE(RelativeError(outs[2], outs[0]), 1e-2) << what << " segmented o";
      EXPECT_LE(RelativeError(states[2], states[0]), K == 256 ? 1e-2 : 1e-5)
          << what << " segmented final state";
    }
}

// The backward's scans, all three on the tensor-core path: dq forward, dk
// and dv reverse with shifted gates; for vector decays the dq and dk scans
// carry the decay on the right.
TEST_F(MmaScanVsCpu, DecayBackward) {
  for (DecayKind kind : {DecayKind::kScalar, DecayKind::kVector})
    for (const DecayRange& range : kRanges) {
      MakeBatch({130, 1, 0, 70});
      const int64_t n = offsets_.back();
      const int H = 2, K = 64, V = 64, S = batch_.num_seqs;
      const std::string what =
          "backward kind " + std::to_string(static_cast<int>(kind)) + " " + range.name;
      const DType dt = DType::kBF16;
      const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                   v = Rand({n, H, V}, -1, 1);
      const Tensor g = Rand({n, H}, range.lo, range.hi), gk = Rand({n, H, K}, range.lo, range.hi);
      const Tensor h0 = Rand({S + 1, H, K, V}, -1, 1), d_o = Rand({n, H, V}, -1, 1);
      const Tensor d_ht = Rand({S, H, K, V}, -1, 1);
      DecayBackwardArgs cb, db;
      for (DecayBackwardArgs* b : {&cb, &db}) {
        b->fwd.kind = kind;
        b->fwd.heads = H, b->fwd.key_dim = K, b->fwd.value_dim = V, b->fwd.scale = 0.125f;
      }
      cb.fwd.q = Cpu(q, dt), cb.fwd.k = Cpu(k, dt), cb.fwd.v = Cpu(v, dt);
      db.fwd.q = Gpu(q, dt), db.fwd.k = Gpu(k, dt), db.fwd.v = Gpu(v, dt);
      cb.fwd.g = g.Clone(), cb.fwd.gk = gk.Clone();
      db.fwd.g = Gpu(g, DType::kF32), db.fwd.gk = Gpu(gk, DType::kF32);
      cb.fwd.state = h0.Clone();
      db.fwd.state = Gpu(h0, DType::kF32);
      cb.d_o = Cpu(d_o, dt), db.d_o = Gpu(d_o, dt);
      cb.d_ht = d_ht.Clone(), db.d_ht = Gpu(d_ht, DType::kF32);
      for (bool on_gpu : {false, true}) {
        DecayBackwardArgs& b = on_gpu ? db : cb;
        auto make = [&](const Shape& s, DType t) {
          return on_gpu ? Gpu(Rand(s, 7, 8), t) : Tensor::Zeros(DType::kF32, s);
        };
        b.dq = make({n, H, K}, dt), b.dk = make({n, H, K}, dt), b.dv = make({n, H, V}, dt);
        b.dh0 = make({S, H, K, V}, DType::kF32);
      }
      ASSERT_TRUE(cpu_->DecayBackward(batch_, cb).ok()) << what;
      const absl::Status st = gpu_->DecayBackward(batch_, db);
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      Expect(db.dq, cb.dq, kGradTol, what + " dq");
      Expect(db.dk, cb.dk, kGradTol, what + " dk");
      Expect(db.dv, cb.dv, kGradTol, what + " dv");
      Expect(db.dh0, cb.dh0, kGradTol, what + " dh0");
    }
}

// Stabilizer, key weights and both normalizers in the scalar mode, across
// chunk boundaries and from pooled (c, n, m).
TEST_F(MmaScanVsCpu, MlstmForward) {
  for (const auto& [K, V] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{256, 64}})
    for (MlstmKind kind : {MlstmKind::kExp, MlstmKind::kSig, MlstmKind::kSigNorm}) {
      MakeBatch({130, 1, 0, 64, 200});
      const int64_t n = offsets_.back();
      const int H = 2, S = batch_.num_seqs;
      const DType dt = DType::kBF16;
      const std::string what =
          "mlstm K=" + std::to_string(K) + " kind " + std::to_string(static_cast<int>(kind));
      const Tensor q = Rand({n, H, K}, -1, 1), k = Rand({n, H, K}, -1, 1),
                   v = Rand({n, H, V}, -1, 1);
      const Tensor ig = Rand({n, H}, -3, 3), fg = Rand({n, H}, -1, 5);
      const Tensor c0 = Rand({S + 1, H, K, V}, -1, 1), n0 = Rand({S + 1, H, K}, -1, 1);
      const Tensor m0 = Rand({S + 1, H}, -1, 1);
      MlstmForwardArgs c, d;
      for (MlstmForwardArgs* a : {&c, &d})
        a->kind = kind, a->heads = H, a->key_dim = K, a->value_dim = V;
      c.q = Cpu(q, dt), c.k = Cpu(k, dt), c.v = Cpu(v, dt), c.i = ig.Clone(), c.f = fg.Clone();
      d.q = Gpu(q, dt), d.k = Gpu(k, dt), d.v = Gpu(v, dt);
      d.i = Gpu(ig, DType::kF32), d.f = Gpu(fg, DType::kF32);
      c.h = Tensor::Zeros(DType::kF32, {n, H, V});
      d.h = Gpu(Rand({n, H, V}, 7, 8), dt);
      c.state_c = c0.Clone(), c.state_n = n0.Clone(), c.state_m = m0.Clone();
      d.state_c = Gpu(c0, DType::kF32), d.state_n = Gpu(n0, DType::kF32),
      d.state_m = Gpu(m0, DType::kF32);
      ASSERT_TRUE(cpu_->MlstmForward(batch_, c, MixerForm::kChunked).ok()) << what;
      const absl::Status st = gpu_->MlstmForward(batch_, d, MixerForm::kChunked);
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      Expect(d.h, c.h, kTol, what + " h");
      Expect(d.state_c, c.state_c, kTol, what + " c");
      Expect(d.state_n, c.state_n, kTol, what + " n");
      if (kind == MlstmKind::kExp) Expect(d.state_m, c.state_m, kTol, what + " m");
    }
}

}  // namespace
}  // namespace lair::kernels
