// CudaBackend: validation, memory and the mapping of each mixer onto the
// generic scans of kernels/cuda/scan.h.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dense_ops.h"
#include "kernels/cuda/mixer_backward.h"
#include "kernels/cuda/scan.h"
#include "kernels/gsa_passes.h"

namespace lair::kernels {
namespace {

using cuda::ElemType;
using cuda::LogGate;
using cuda::Operand;
using cuda::ScanParams;
using cuda::StateRef;

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", std::string(what), ": ", cudaGetErrorString(err)));
}

// The stream outlives every tensor allocated on it (deleters hold it).
struct StreamHolder {
  int device = 0;
  cudaStream_t stream = nullptr;
  ~StreamHolder() {
    if (stream) {
      cudaSetDevice(device);
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

ElemType Elem(DType d) {
  switch (d) {
    case DType::kBF16:
      return ElemType::kBF16;
    case DType::kF16:
      return ElemType::kF16;
    default:
      return ElemType::kF32;
  }
}

Operand Op(const Tensor& t) { return Operand{t.raw(), Elem(t.dtype())}; }

// A defined CUDA tensor of exactly `shape`, float dtype (F32 only when f32_only).
absl::Status CheckTensor(const Tensor& t, const Shape& shape, std::string_view what,
                         bool f32_only) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is undefined"));
  if (t.device() != Device::kCuda)
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is not on the CUDA device"));
  LAIR_RETURN_IF_ERROR(ExpectShape(t, shape, what));
  if (f32_only ? t.dtype() != DType::kF32 : !IsFloat(t.dtype()))
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " has dtype ",
                                                   std::string(DTypeName(t.dtype()))));
  return absl::OkStatus();
}

// Offsets and slots in device memory, plus what the host learned from them.
struct DeviceBatch {
  const int32_t* cu_seqlens = nullptr;
  const int32_t* slots = nullptr;
  int64_t tokens = 0;
  int max_len = 0;
  Tensor keep_offsets, keep_slots;  // uploads made here
};

LogGate Gate(const Tensor& t, int token_stride, int head_stride) {
  LogGate g;
  g.ptr = t.defined() ? t.f32() : nullptr;
  g.token_stride = token_stride;
  g.head_stride = head_stride;
  return g;
}

LogGate Shifted(LogGate g) {
  g.shift = true;
  return g;
}

class CudaBackend : public Backend {
 public:
  CudaBackend(std::shared_ptr<StreamHolder> stream, std::string name,
              std::unique_ptr<cuda::CudaDenseOps> dense)
      : stream_(std::move(stream)), name_(std::move(name)), dense_(std::move(dense)) {}

  Device device() const override { return Device::kCuda; }
  std::string Name() const override { return name_; }

  absl::StatusOr<Tensor> Allocate(DType dtype, Shape shape) override {
    LAIR_ASSIGN_OR_RETURN(Tensor t, Uninitialized(dtype, std::move(shape)));
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(t.raw(), 0, t.nbytes(), s()), "memset"));
    return t;
  }

  absl::StatusOr<Tensor> Upload(const Tensor& host, DType dtype) override {
    if (host.device() != Device::kCpu) return absl::InvalidArgumentError("Upload needs a host tensor");
    Tensor src = host;
    if (host.dtype() != dtype) {
      if (!IsFloat(host.dtype()) || !IsFloat(dtype))
        return absl::InvalidArgumentError("Upload converts between float dtypes only");
      const Tensor f = host.ToF32();
      src = Tensor::Zeros(dtype, host.shape());
      const float* in = f.f32();
      for (int64_t i = 0; i < f.numel(); ++i) {
        if (dtype == DType::kF32) {
          src.f32()[i] = in[i];
        } else if (dtype == DType::kBF16) {
          src.data<uint16_t>()[i] = FloatToBF16(in[i]);
        } else {
          src.data<uint16_t>()[i] = FloatToF16(in[i]);
        }
      }
    }
    LAIR_ASSIGN_OR_RETURN(Tensor t, Uninitialized(dtype, host.shape()));
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(t.raw(), src.raw(), t.nbytes(), cudaMemcpyHostToDevice, s()), "upload"));
    // The host copy must stay alive until the copy ran.
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s()), "upload"));
    return t;
  }

  absl::StatusOr<Tensor> Download(const Tensor& device_tensor) override {
    if (device_tensor.device() != Device::kCuda)
      return absl::InvalidArgumentError("Download needs a CUDA tensor");
    Tensor host = Tensor::Zeros(device_tensor.dtype(), device_tensor.shape());
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host.raw(), device_tensor.raw(), host.nbytes(),
                                                    cudaMemcpyDeviceToHost, s()),
                                    "download"));
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s()), "download"));
    return host;
  }

  absl::Status Copy(const Tensor& src, const Tensor& dst) override {
    if (src.device() != Device::kCuda || dst.device() != Device::kCuda || src.dtype() != dst.dtype() ||
        src.numel() != dst.numel())
      return absl::InvalidArgumentError(
          absl::StrCat("Copy ", src.DebugString(), " to ", dst.DebugString()));
    return CudaStatus(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, s()),
                      "copy");
  }

  // Also reports device-side index faults of the dense ops since the last call.
  absl::Status Synchronize() override {
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s()), "synchronize"));
    return dense_->TakeIndexFault();
  }

  absl::Status DecayForward(const SequenceBatch& batch, const DecayForwardArgs& a,
                            MixerForm form) override {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckDecay(batch, a));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.o, {db.tokens, a.heads, a.value_dim}, "o", false));
    ScanParams p = DecayScan(db, batch, a);
    const StateRef pool = Pool(a.state, db.slots, a.key_dim, a.value_dim);
    p.s_init = batch.zero_initial_state ? StateRef{} : pool;
    p.s_final = pool;
    p.o = a.o.raw();
    p.o_type = Elem(a.o.dtype());
    return Run(p, db, batch, form, "decay forward");
  }

  absl::Status DecayBackward(const SequenceBatch& batch, const DecayBackwardArgs& b) override {
    const DecayForwardArgs& a = b.fwd;
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckDecay(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, S = batch.num_seqs;
    // The dq pass scans with value_dim in the key role (the ULA permutation).
    if (V > 256) return absl::InvalidArgumentError("the CUDA decay backward needs value_dim ≤ 256");
    LAIR_RETURN_IF_ERROR(CheckTensor(b.d_o, {n, H, V}, "d_o", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dq, {n, H, K}, "dq", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dk, {n, H, K}, "dk", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dv, {n, H, V}, "dv", false));
    if (b.d_ht.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_ht, {S, H, K, V}, "d_ht", true));
    if (b.dh0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.dh0, {S, H, K, V}, "dh0", true));
    // Decay gradients are optional: an undefined output is not computed.
    const Tensor& d_left = a.kind == DecayKind::kConstant ? b.d_log_gamma
                           : a.kind == DecayKind::kScalar ? b.dg
                                                          : b.dgk;
    const bool right = a.kind == DecayKind::kLeftRight;
    const bool want_left = a.kind != DecayKind::kNone && d_left.defined();
    const bool want_right = right && b.dgv.defined();
    if (want_left) {
      const Shape shape = a.kind == DecayKind::kConstant ? Shape{H}
                          : a.kind == DecayKind::kScalar ? Shape{n, H}
                                                         : Shape{n, H, K};
      LAIR_RETURN_IF_ERROR(CheckTensor(d_left, shape, "decay gradient", true));
    }
    if (want_right) LAIR_RETURN_IF_ERROR(CheckTensor(b.dgv, {n, H, V}, "dgv", true));
    const bool decay_grads = want_left || want_right;
    const StateRef pool = Pool(a.state, db.slots, K, V);

    // Forward again for s_n (the final-state term) and o (the right-decay term).
    Tensor s_n, o_f;
    if (decay_grads && (b.d_ht.defined() || want_right)) {
      LAIR_ASSIGN_OR_RETURN(s_n, Uninitialized(DType::kF32, {S, H, K, V}));
      LAIR_ASSIGN_OR_RETURN(o_f, Uninitialized(DType::kF32, {n, H, V}));
      ScanParams p = DecayScan(db, batch, a);
      p.s_init = batch.zero_initial_state ? StateRef{} : pool;
      p.s_final = Dense(s_n.f32(), H, K, V);
      p.o = o_f.raw();
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward (forward pass)"));
    }

    // The gates of each permutation; scalar decays commute, so they stay on the left.
    const bool left_vec = a.kind == DecayKind::kVector || a.kind == DecayKind::kLeftRight;
    const LogGate L = LeftGate(a);
    const LogGate R = right ? Gate(a.gv, H * V, V) : LogGate{};
    LAIR_ASSIGN_OR_RETURN(Tensor dq_f, Uninitialized(DType::kF32, {n, H, K}));
    LAIR_ASSIGN_OR_RETURN(Tensor dk_f, Uninitialized(DType::kF32, {n, H, K}));
    LAIR_ASSIGN_OR_RETURN(Tensor dv_f, Uninitialized(DType::kF32, {n, H, V}));

    // dQ = f(dO, V, K, R, L), starting from s0ᵀ.
    {
      ScanParams p = Base(db, batch, H, V, K);
      p.q = Op(b.d_o);
      p.q_scale = a.scale;
      p.k = Op(a.v);
      p.v = Op(a.k);
      if (left_vec) {
        p.left = R;
        p.left_vector = right;
        p.right = L;
      } else {
        p.left = L;
      }
      if (!batch.zero_initial_state) p.s_init = Transposed(pool, V);
      p.o = dq_f.raw();
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward dq"));
    }
    // dV = f(K, Q, dO, L+, R+, reverse) from dS_n; its last state is G_1.
    Tensor g1;
    {
      ScanParams p = Base(db, batch, H, K, V);
      p.reverse = true;
      p.q = Op(a.k);
      p.k = Op(a.q);
      p.k_scale = a.scale;
      p.v = Op(b.d_o);
      p.left = Shifted(L);
      p.left_vector = left_vec;
      if (right) p.right = Shifted(R);
      if (b.d_ht.defined()) p.s_init = Dense(b.d_ht.f32(), H, K, V);
      if (b.dh0.defined()) {
        LAIR_ASSIGN_OR_RETURN(g1, Uninitialized(DType::kF32, {S, H, K, V}));
        p.s_final = Dense(g1.f32(), H, K, V);
      }
      p.o = dv_f.raw();
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward dv"));
    }
    // dK = f(V, dO, Q, R+, L+, reverse) from dS_nᵀ.
    {
      ScanParams p = Base(db, batch, H, V, K);
      p.reverse = true;
      p.q = Op(a.v);
      p.k = Op(b.d_o);
      p.k_scale = a.scale;
      p.v = Op(a.q);
      if (left_vec) {
        if (right) p.left = Shifted(R);
        p.left_vector = right;
        p.right = Shifted(L);
      } else {
        p.left = Shifted(L);
      }
      if (b.d_ht.defined()) p.s_init = Transposed(Dense(b.d_ht.f32(), H, K, V), V);
      p.o = dk_f.raw();
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward dk"));
    }
    if (b.dh0.defined()) {
      LAIR_RETURN_IF_ERROR(CudaStatus(
          cuda::LaunchScaleByFirstDecay(g1.f32(), S, H, K, V, db.cu_seqlens, L, left_vec, R,
                                        b.dh0.f32(), s()),
          "decay backward dh0"));
    }
    // Decay gradients: reverse cumsums of q⊙dq − k⊙dk (and o⊙do − v⊙dv).
    if (want_left || want_right) {
      cuda::DecayGradParams g;
      g.num_seqs = S;
      g.heads = H;
      g.tokens = n;
      g.cu_seqlens = db.cu_seqlens;
      g.dim = K;
      g.other = V;
      g.x = Op(a.q);
      g.dx = Op(dq_f);
      g.y = Op(a.k);
      g.dy = Op(dk_f);
      if (b.d_ht.defined()) {
        g.d_state = b.d_ht.f32();
        g.state = s_n.f32();
      }
      g.reduce_features = !left_vec;
      if (want_left) {
        Tensor dg_all;
        if (a.kind == DecayKind::kConstant) {
          LAIR_ASSIGN_OR_RETURN(dg_all, Uninitialized(DType::kF32, {n, H}));
          g.out = dg_all.f32();
        } else {
          g.out = d_left.f32();
        }
        LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchDecayGrad(g, s()), "decay backward dg"));
        if (a.kind == DecayKind::kConstant) {
          LAIR_RETURN_IF_ERROR(CudaStatus(
              cuda::LaunchSumTokens(dg_all.f32(), n, H, b.d_log_gamma.f32(), s()), "d_log_gamma"));
        }
      }
      if (want_right) {
        g.dim = V;
        g.other = K;
        g.transposed = true;
        g.x = Operand{o_f.raw(), ElemType::kF32};
        g.dx = Op(b.d_o);
        g.y = Op(a.v);
        g.dy = Op(dv_f);
        g.out = b.dgv.f32();
        LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchDecayGrad(g, s()), "decay backward dgv"));
      }
    }
    LAIR_RETURN_IF_ERROR(ConvertInto(dq_f, b.dq));
    LAIR_RETURN_IF_ERROR(ConvertInto(dk_f, b.dk));
    return ConvertInto(dv_f, b.dv);
  }

  absl::Status GsaForward(const SequenceBatch& batch, const GsaForwardArgs& a,
                          MixerForm /*form*/) override {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckGsa(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, M = a.num_slots_m;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.o, {n, H, V}, "o", false));
    LAIR_ASSIGN_OR_RETURN(Tensor z, Uninitialized(DType::kF32, {n, H, M}));
    // Pass 1: Hk_t = Hk_{t-1} diag(e^{g_t}) + k_t s_tᵀ, z_t = scale·Hk_tᵀq_t.
    {
      ScanParams p = Base(db, batch, H, K, M);
      p.q = Op(a.q);
      p.q_scale = a.scale;
      p.k = Op(a.k);
      p.v = Op(a.s);
      p.right = Gate(a.g, H * M, M);
      const StateRef pool = Pool(a.state_k, db.slots, K, M);
      p.s_init = batch.zero_initial_state ? StateRef{} : pool;
      p.s_final = pool;
      p.o = z.raw();
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "gsa pass 1"));
    }
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchSoftmaxRows(z.f32(), n * H, M, s()), "gsa softmax"));
    // Pass 2: Hv_t = diag(e^{g_t}) Hv_{t-1} + s_t v_tᵀ, o_t = Hv_tᵀ p_t.
    ScanParams p = Base(db, batch, H, M, V);
    p.q = Operand{z.raw(), ElemType::kF32};
    p.k = Op(a.s);
    p.v = Op(a.v);
    p.left = Gate(a.g, H * M, M);
    p.left_vector = true;
    const StateRef pool = Pool(a.state_v, db.slots, M, V);
    p.s_init = batch.zero_initial_state ? StateRef{} : pool;
    p.s_final = pool;
    p.o = a.o.raw();
    p.o_type = Elem(a.o.dtype());
    return CudaStatus(cuda::LaunchScan(p, s()), "gsa pass 2");
  }

  // Composed as kernels/cpu/gsa.cc: pass 1 again for P, pass 2 backward, the
  // softmax Jacobian, pass 1 backward, and the s and g gradients of both passes.
  absl::Status GsaBackward(const SequenceBatch& batch, const GsaBackwardArgs& b) override {
    const GsaForwardArgs& a = b.fwd;
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckGsa(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, M = a.num_slots_m, S = batch.num_seqs;
    if (V > 128 || V % 4 != 0)
      return absl::InvalidArgumentError("GSA backward on CUDA needs value_dim ≤ 128, a multiple of 4");
    LAIR_RETURN_IF_ERROR(CheckTensor(b.d_o, {n, H, V}, "d_o", false));
    if (b.d_hkt.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hkt, {S, H, K, M}, "d_hkt", true));
    if (b.d_hvt.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hvt, {S, H, M, V}, "d_hvt", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dq, {n, H, K}, "dq", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dk, {n, H, K}, "dk", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dv, {n, H, V}, "dv", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.ds, {n, H, M}, "ds", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dg, {n, H, M}, "dg", true));
    if (b.d_hk0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hk0, {S, H, K, M}, "d_hk0", true));
    if (b.d_hv0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hv0, {S, H, M, V}, "d_hv0", true));

    // 1. P from pass 1, run on private copies of the initial Hk (slot = sequence).
    const int64_t per_slot = int64_t{H} * K * M;
    LAIR_ASSIGN_OR_RETURN(Tensor hk, Uninitialized(DType::kF32, {S, H, K, M}));
    if (!batch.zero_initial_state) {
      for (int seq = 0; seq < S; ++seq) {
        LAIR_RETURN_IF_ERROR(CudaStatus(
            cudaMemcpyAsync(hk.f32() + seq * per_slot, a.state_k.f32() + batch.state_slot[seq] * per_slot,
                            per_slot * sizeof(float), cudaMemcpyDeviceToDevice, s()),
            "gsa backward state copy"));
      }
    }
    std::vector<int32_t> own_slots(static_cast<size_t>(S));
    std::iota(own_slots.begin(), own_slots.end(), 0);
    SequenceBatch own = batch;
    own.state_slot = own_slots;
    own.state_slot_device = nullptr;
    LAIR_ASSIGN_OR_RETURN(Tensor zero_gk, Allocate(DType::kF32, {n, H, K}));
    LAIR_ASSIGN_OR_RETURN(Tensor p, Uninitialized(DType::kF32, {n, H, M}));
    DecayForwardArgs pass1 = GsaKeyPass(a, zero_gk, hk);
    pass1.o = p;
    LAIR_RETURN_IF_ERROR(DecayForward(own, pass1, MixerForm::kChunked));
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchSoftmaxRows(p.f32(), n * H, M, s()), "gsa backward softmax"));

    // 2. Pass 2 backward: dP, ds (key side), dv, dg, dHv_0.
    LAIR_ASSIGN_OR_RETURN(Tensor dp, Uninitialized(DType::kF32, {n, H, M}));
    LAIR_ASSIGN_OR_RETURN(Tensor ds_key, Uninitialized(DType::kF32, {n, H, M}));
    DecayBackwardArgs back2;
    back2.fwd = GsaValuePass(a, p, a.state_v);
    back2.d_o = b.d_o;
    back2.d_ht = b.d_hvt;
    back2.dq = dp;
    back2.dk = ds_key;
    back2.dv = b.dv;
    back2.dgk = b.dg;
    back2.dh0 = b.d_hv0;
    LAIR_RETURN_IF_ERROR(DecayBackward(batch, back2));

    // 3. dZ = P ⊙ (dP − <P, dP>), in place of dP.
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchSoftmaxBackward(p.f32(), dp.f32(), n * H, M, s()), "gsa backward softmax jacobian"));

    // 4. Pass 1 backward: dq, dk, ds (value side), dg, dHk_0.
    LAIR_ASSIGN_OR_RETURN(Tensor ds_value, Uninitialized(DType::kF32, {n, H, M}));
    LAIR_ASSIGN_OR_RETURN(Tensor dg_value, Uninitialized(DType::kF32, {n, H, M}));
    DecayBackwardArgs back1;
    back1.fwd = GsaKeyPass(a, zero_gk, a.state_k);
    back1.d_o = dp;
    back1.d_ht = b.d_hkt;
    back1.dq = b.dq;
    back1.dk = b.dk;
    back1.dv = ds_value;
    back1.dgv = dg_value;
    back1.dh0 = b.d_hk0;
    LAIR_RETURN_IF_ERROR(DecayBackward(batch, back1));

    // 5. Both passes read s and g.
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchAdd(ds_key.f32(), ds_value.f32(), b.ds.raw(), Elem(b.ds.dtype()), n * H * M, s()),
        "gsa backward ds"));
    return CudaStatus(cuda::LaunchAdd(b.dg.f32(), dg_value.f32(), b.dg.raw(), ElemType::kF32, n * H * M, s()),
                      "gsa backward dg");
  }

  absl::Status MlstmForward(const SequenceBatch& batch, const MlstmForwardArgs& a,
                            MixerForm form) override {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckMlstm(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.h, {n, H, V}, "h", false));
    const bool exp_gate = a.kind == MlstmKind::kExp;
    if (K > 128 || K % 4 != 0) return absl::InvalidArgumentError("mLSTM on CUDA needs key_dim ≤ 128, multiple of 4");

    ScanParams p = Base(db, batch, H, K, V);
    p.q = Op(a.q);
    p.q_scale = 1.0f / std::sqrt(static_cast<float>(K));
    p.k = Op(a.k);
    p.v = Op(a.v);
    p.left = Gate(a.f, H, 1);
    p.left.fn = cuda::GateFn::kLogSigmoid;
    p.key_weight = Gate(a.i, H, 1);
    p.key_weight.fn = exp_gate ? cuda::GateFn::kIdentity : cuda::GateFn::kLogSigmoid;
    p.stabilize = exp_gate;
    p.norm = a.kind == MlstmKind::kExp      ? cuda::NormKind::kMlstmExp
             : a.kind == MlstmKind::kSigNorm ? cuda::NormKind::kSigNorm
                                             : cuda::NormKind::kNone;
    p.eps = a.eps;
    const StateRef pool = Pool(a.state_c, db.slots, K, V);
    p.s_init = batch.zero_initial_state ? StateRef{} : pool;
    p.s_final = pool;
    // n and m are read by every dv tile and written by tile 0: read copies.
    Tensor n0, m0;
    if (!batch.zero_initial_state) {
      LAIR_ASSIGN_OR_RETURN(n0, Uninitialized(DType::kF32, a.state_n.shape()));
      LAIR_RETURN_IF_ERROR(Copy(a.state_n, n0));
      p.n_init = n0.f32();
      if (exp_gate) {
        LAIR_ASSIGN_OR_RETURN(m0, Uninitialized(DType::kF32, a.state_m.shape()));
        LAIR_RETURN_IF_ERROR(Copy(a.state_m, m0));
        p.m_init = m0.f32();
      }
    }
    p.n_final = a.state_n.f32();
    if (exp_gate) p.m_final = a.state_m.f32();
    p.o = a.h.raw();
    p.o_type = Elem(a.h.dtype());
    return Run(p, db, batch, form, "mlstm forward");
  }

  // Exact reverse mode through the recurrent step (kernels/cuda/mixer_backward.h).
  absl::Status MlstmBackward(const SequenceBatch& batch, const MlstmBackwardArgs& b) override {
    const MlstmForwardArgs& a = b.fwd;
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckMlstm(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, S = batch.num_seqs;
    if (K < 1 || V < 1 || K > cuda::kMlstmBackwardMaxDim || V > cuda::kMlstmBackwardMaxDim)
      return absl::InvalidArgumentError(absl::StrCat("mLSTM backward on CUDA needs key_dim and value_dim in [1, ",
                                                     cuda::kMlstmBackwardMaxDim, "], got key_dim ", K,
                                                     ", value_dim ", V));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.d_h, {n, H, V}, "d_h", false));
    if (b.d_ct.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_ct, {S, H, K, V}, "d_ct", true));
    if (b.d_nt.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_nt, {S, H, K}, "d_nt", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dq, {n, H, K}, "dq", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dk, {n, H, K}, "dk", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dv, {n, H, V}, "dv", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.di, {n, H}, "di", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.df, {n, H}, "df", true));
    if (b.d_c0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_c0, {S, H, K, V}, "d_c0", true));
    if (b.d_n0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_n0, {S, H, K}, "d_n0", true));

    cuda::MlstmBackwardParams p;
    p.num_seqs = S;
    p.heads = H;
    p.dk = K;
    p.dv = V;
    p.max_len = db.max_len;
    // Checkpoints every ⌈√T⌉ tokens: O(√T) states of scratch per (sequence, head).
    p.block = 1;
    while (p.block * p.block < db.max_len) ++p.block;
    p.cu_seqlens = db.cu_seqlens;
    p.gate = a.kind == MlstmKind::kExp   ? cuda::MlstmGate::kExp
             : a.kind == MlstmKind::kSig ? cuda::MlstmGate::kSig
                                         : cuda::MlstmGate::kSigNorm;
    p.eps = a.eps;
    p.q = Op(a.q);
    p.k = Op(a.k);
    p.v = Op(a.v);
    p.dh = Op(b.d_h);
    p.i = a.i.f32();
    p.f = a.f.f32();
    if (!batch.zero_initial_state) {
      p.slot = db.slots;
      p.c_init = a.state_c.f32();
      p.n_init = a.state_n.f32();
      if (a.kind == MlstmKind::kExp) p.m_init = a.state_m.f32();
    }
    p.d_ct = b.d_ct.defined() ? b.d_ct.f32() : nullptr;
    p.d_nt = b.d_nt.defined() ? b.d_nt.f32() : nullptr;
    p.dq = b.dq.raw();
    p.dq_type = Elem(b.dq.dtype());
    p.dk_out = b.dk.raw();
    p.dk_type = Elem(b.dk.dtype());
    p.dv_out = b.dv.raw();
    p.dv_type = Elem(b.dv.dtype());
    p.di = b.di.f32();
    p.df = b.df.f32();
    p.d_c0 = b.d_c0.defined() ? b.d_c0.f32() : nullptr;
    p.d_n0 = b.d_n0.defined() ? b.d_n0.f32() : nullptr;
    LAIR_ASSIGN_OR_RETURN(Tensor scratch, Uninitialized(DType::kF32, {cuda::MlstmBackwardScratchFloats(p)}));
    p.scratch = scratch.f32();
    return CudaStatus(cuda::LaunchMlstmBackward(p, s()), "mlstm backward");
  }

  // --- Dense operations: kernels/cuda/dense_ops.h on the same stream -------
  absl::Status Gemm(const GemmArgs& a) override { return dense_->Gemm(a); }
  absl::Status Embedding(const EmbeddingArgs& a) override { return dense_->Embedding(a); }
  absl::Status EmbeddingBackward(const EmbeddingBackwardArgs& a) override { return dense_->EmbeddingBackward(a); }
  absl::Status Norm(const NormArgs& a) override { return dense_->Norm(a); }
  absl::Status NormBackward(const NormBackwardArgs& a) override { return dense_->NormBackward(a); }
  absl::Status Unary(const UnaryArgs& a) override { return dense_->Unary(a); }
  absl::Status UnaryBackward(const UnaryBackwardArgs& a) override { return dense_->UnaryBackward(a); }
  absl::Status Binary(const BinaryArgs& a) override { return dense_->Binary(a); }
  absl::Status ReduceSum(const ReduceSumArgs& a) override { return dense_->ReduceSum(a); }
  absl::Status CopyColumns(const CopyColumnsArgs& a) override { return dense_->CopyColumns(a); }
  absl::Status Conv1d(const SequenceBatch& batch, const Conv1dArgs& a) override { return dense_->Conv1d(batch, a); }
  absl::Status Conv1dBackward(const SequenceBatch& batch, const Conv1dBackwardArgs& a) override { return dense_->Conv1dBackward(batch, a); }
  absl::Status Rotary(const RotaryArgs& a) override { return dense_->Rotary(a); }
  absl::Status Attention(const SequenceBatch& batch, const AttentionArgs& a) override { return dense_->Attention(batch, a); }
  absl::Status AttentionBackward(const SequenceBatch& batch, const AttentionBackwardArgs& a) override { return dense_->AttentionBackward(batch, a); }
  absl::Status CrossEntropy(const CrossEntropyArgs& a) override { return dense_->CrossEntropy(a); }

 private:
  cudaStream_t s() const { return stream_->stream; }

  // Device memory freed on the stream when the last handle goes.
  absl::StatusOr<Tensor> Uninitialized(DType dtype, Shape shape) {
    const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
    void* ptr = nullptr;
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&ptr, bytes > 0 ? bytes : 16, s()), "malloc"));
    std::shared_ptr<StreamHolder> holder = stream_;
    std::shared_ptr<void> owner(ptr, [holder](void* p) { cudaFreeAsync(p, holder->stream); });
    return Tensor::Wrap(ptr, dtype, std::move(shape), Device::kCuda, std::move(owner));
  }

  absl::Status ConvertInto(const Tensor& src, const Tensor& dst) {
    return CudaStatus(cuda::LaunchConvert(src.raw(), Elem(src.dtype()), dst.raw(), Elem(dst.dtype()),
                                          src.numel(), s()),
                      "convert");
  }

  // Checks the offsets and slots on the host and finds their device copies.
  absl::StatusOr<DeviceBatch> Prepare(const SequenceBatch& batch, const Tensor& q) {
    DeviceBatch db;
    const int S = batch.num_seqs;
    if (S < 0 || batch.cu_seqlens.size() != static_cast<size_t>(S) + 1 ||
        batch.state_slot.size() != static_cast<size_t>(S))
      return absl::InvalidArgumentError("cu_seqlens needs num_seqs + 1 entries, state_slot num_seqs");
    if (q.rank() != 3) return absl::InvalidArgumentError(absl::StrCat("q is ", q.DebugString()));
    if (batch.cu_seqlens[0] != 0) return absl::InvalidArgumentError("cu_seqlens[0] must be 0");
    for (int i = 0; i < S; ++i) {
      const int len = batch.cu_seqlens[i + 1] - batch.cu_seqlens[i];
      if (len < 0) return absl::InvalidArgumentError("cu_seqlens must not decrease");
      db.max_len = std::max(db.max_len, len);
    }
    db.tokens = batch.cu_seqlens[S];
    if (db.tokens != q.dim(0))
      return absl::InvalidArgumentError(
          absl::StrCat("cu_seqlens ends at ", db.tokens, " but q has ", q.dim(0), " tokens"));
    if (batch.cu_seqlens_device) {
      db.cu_seqlens = batch.cu_seqlens_device;
    } else {
      LAIR_ASSIGN_OR_RETURN(db.keep_offsets, UploadInts(batch.cu_seqlens));
      db.cu_seqlens = db.keep_offsets.data<int32_t>();
    }
    if (batch.state_slot_device) {
      db.slots = batch.state_slot_device;
    } else {
      LAIR_ASSIGN_OR_RETURN(db.keep_slots, UploadInts(batch.state_slot));
      db.slots = db.keep_slots.data<int32_t>();
    }
    return db;
  }

  absl::StatusOr<Tensor> UploadInts(std::span<const int32_t> values) {
    Tensor host = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), host.data<int32_t>());
    return Upload(host, DType::kI32);
  }

  absl::Status CheckPool(const Tensor& pool, int H, int d1, int d2, const SequenceBatch& batch,
                         std::string_view what) {
    if (!pool.defined() || pool.rank() != 4)
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " must be [slots,H,.,.]"));
    LAIR_RETURN_IF_ERROR(CheckTensor(pool, {pool.dim(0), H, d1, d2}, what, true));
    for (int32_t slot : batch.state_slot)
      if (slot < 0 || slot >= pool.dim(0))
        return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": slot ", slot, " out of range"));
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceBatch> CheckDecay(const SequenceBatch& batch, const DecayForwardArgs& a) {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, Prepare(batch, a.q));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.q, {n, H, K}, "q", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.k, {n, H, K}, "k", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.v, {n, H, V}, "v", false));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state, H, K, V, batch, "state"));
    switch (a.kind) {
      case DecayKind::kConstant:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.log_gamma, {H}, "log_gamma", true));
        break;
      case DecayKind::kScalar:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.g, {n, H}, "g", true));
        break;
      case DecayKind::kLeftRight:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.gv, {n, H, V}, "gv", true));
        [[fallthrough]];
      case DecayKind::kVector:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.gk, {n, H, K}, "gk", true));
        break;
      case DecayKind::kNone:
        break;
    }
    // The scan keeps a [key_dim, 64] state tile in shared memory; value_dim is tiled.
    if (K > 256 || K % 4 != 0 || V % 4 != 0)
      return absl::InvalidArgumentError("the CUDA decay kernels need key_dim ≤ 256 and key_dim, value_dim multiples of 4");
    return db;
  }

  // What GSA forward and backward both read.
  absl::StatusOr<DeviceBatch> CheckGsa(const SequenceBatch& batch, const GsaForwardArgs& a) {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, Prepare(batch, a.q));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, M = a.num_slots_m;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.q, {n, H, K}, "q", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.k, {n, H, K}, "k", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.v, {n, H, V}, "v", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.s, {n, H, M}, "s", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.g, {n, H, M}, "g", true));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state_k, H, K, M, batch, "state_k"));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state_v, H, M, V, batch, "state_v"));
    if (K > 128 || M > 128 || K % 4 != 0 || M % 4 != 0)
      return absl::InvalidArgumentError("GSA on CUDA needs key_dim and num_slots_m ≤ 128, multiples of 4");
    return db;
  }

  // What mLSTM forward and backward both read.
  absl::StatusOr<DeviceBatch> CheckMlstm(const SequenceBatch& batch, const MlstmForwardArgs& a) {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, Prepare(batch, a.q));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.q, {n, H, K}, "q", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.k, {n, H, K}, "k", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.v, {n, H, V}, "v", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.i, {n, H}, "i", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.f, {n, H}, "f", true));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state_c, H, K, V, batch, "state_c"));
    const int64_t slots = a.state_c.dim(0);
    LAIR_RETURN_IF_ERROR(CheckTensor(a.state_n, {slots, H, K}, "state_n", true));
    if (a.kind == MlstmKind::kExp) LAIR_RETURN_IF_ERROR(CheckTensor(a.state_m, {slots, H}, "state_m", true));
    return db;
  }

  static ScanParams Base(const DeviceBatch& db, const SequenceBatch& batch, int H, int dk, int dv) {
    ScanParams p;
    p.num_seqs = batch.num_seqs;
    p.heads = H;
    p.dk = dk;
    p.dv = dv;
    p.cu_seqlens = db.cu_seqlens;
    return p;
  }

  static LogGate LeftGate(const DecayForwardArgs& a) {
    switch (a.kind) {
      case DecayKind::kConstant:
        return Gate(a.log_gamma, 0, 1);
      case DecayKind::kScalar:
        return Gate(a.g, a.heads, 1);
      case DecayKind::kVector:
      case DecayKind::kLeftRight:
        return Gate(a.gk, a.heads * a.key_dim, a.key_dim);
      case DecayKind::kNone:
        break;
    }
    return LogGate{};
  }

  // The forward scan of a decay mixer, without state or output.
  static ScanParams DecayScan(const DeviceBatch& db, const SequenceBatch& batch,
                              const DecayForwardArgs& a) {
    ScanParams p = Base(db, batch, a.heads, a.key_dim, a.value_dim);
    p.q = Op(a.q);
    p.q_scale = a.scale;
    p.k = Op(a.k);
    p.v = Op(a.v);
    p.left = LeftGate(a);
    p.left_vector = a.kind == DecayKind::kVector || a.kind == DecayKind::kLeftRight;
    if (a.kind == DecayKind::kLeftRight) p.right = Gate(a.gv, a.heads * a.value_dim, a.value_dim);
    return p;
  }

  // A [slots, H, d1, d2] pool addressed through the slot table.
  static StateRef Pool(const Tensor& pool, const int32_t* slots, int d1, int d2) {
    StateRef r;
    r.ptr = pool.f32();
    r.slot = slots;
    r.slot_stride = static_cast<int64_t>(pool.dim(1)) * d1 * d2;
    r.stride_a = d2;
    r.stride_b = 1;
    return r;
  }

  // A dense per-sequence [S, H, d1, d2] tensor.
  static StateRef Dense(float* ptr, int heads, int d1, int d2) {
    StateRef r;
    r.ptr = ptr;
    r.slot_stride = static_cast<int64_t>(heads) * d1 * d2;
    r.stride_a = d2;
    r.stride_b = 1;
    return r;
  }

  // The same storage seen as its transpose: [d1, d2] read as [d2, d1].
  static StateRef Transposed(StateRef r, int d2) {
    r.stride_a = 1;
    r.stride_b = d2;
    return r;
  }

  absl::Status Run(const ScanParams& p, const DeviceBatch& db, const SequenceBatch& batch,
                   MixerForm form, std::string_view what) {
    const bool one_token = db.tokens == batch.num_seqs && db.max_len <= 1;
    const bool step = form != MixerForm::kChunked && one_token && p.dv % 32 == 0;
    return CudaStatus(step ? cuda::LaunchStep(p, s()) : cuda::LaunchScan(p, s()), what);
  }

  std::shared_ptr<StreamHolder> stream_;
  std::string name_;
  std::unique_ptr<cuda::CudaDenseOps> dense_;  // destroyed before the stream
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device_index) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    return absl::UnavailableError("no CUDA device is present");
  if (device_index < 0 || device_index >= count)
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device_index, " (", count, " present)"));
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_index), "set device"));
  cudaDeviceProp prop{};
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device_index), "device properties"));
  auto holder = std::make_shared<StreamHolder>();
  holder->device = device_index;
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&holder->stream, cudaStreamNonBlocking), "stream"));
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaDenseOps> dense,
                        cuda::CudaDenseOps::Create(holder->stream));
  return std::unique_ptr<Backend>(new CudaBackend(
      std::move(holder), absl::StrCat("cuda:", device_index, " (", prop.name, ")"), std::move(dense)));
}

}  // namespace lair::kernels
