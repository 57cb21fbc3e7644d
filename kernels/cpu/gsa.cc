// GSA as two decay passes joined by a softmax (specs/gsa.md §1.5, §2.5).
//
// Forward:
//   1. pass 1, decay kLeftRight: Z = scale·q against Hk with (k, v' = s),
//      lk = 0, lv = g; updates state_k;
//   2. P = softmax(Z) over the M slots (max-subtracted);
//   3. pass 2, decay kVector: O = P against Hv with (k' = s, v), lk = g;
//      updates state_v.
// Backward (the decay backward treats its q, k, v and gates as independent,
// so the chain rule just routes the gradients):
//   1. rerun pass 1 from a copy of the initial Hk to get P;
//   2. pass 2 backward: dP, ds (key side), dv, dg (its lk), dHv_0;
//   3. dZ = P ⊙ (dP − <P, dP>);
//   4. pass 1 backward with d_o = dZ: dq (scale included), dk, ds (value
//      side), dg (its lv), dHk_0;
//   5. ds and dg add the two passes.
#include "kernels/cpu/gsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/decay.h"
#include "kernels/cpu/mixer_checks.h"
#include "kernels/gsa_passes.h"

namespace lair::kernels::cpu {
namespace {

// Checks what the forward and backward both read; `distinct_slots` when the
// call writes the slots.
absl::Status CheckGsaInputs(const SequenceBatch& batch, const GsaForwardArgs& a,
                            const std::string& prefix, bool distinct_slots) {
  LAIR_RETURN_IF_ERROR(CheckPositive(a.heads, prefix + "heads"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.key_dim, prefix + "key_dim"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.value_dim, prefix + "value_dim"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.num_slots_m, prefix + "num_slots_m"));
  LAIR_RETURN_IF_ERROR(CheckPositive(a.chunk_size, prefix + "chunk_size"));
  LAIR_RETURN_IF_ERROR(CheckRank(a.q, prefix + "q", 3));
  LAIR_RETURN_IF_ERROR(CheckRank(a.state_k, prefix + "state_k", 4));
  const int64_t n = a.q.dim(0), h = a.heads, k = a.key_dim, v = a.value_dim, m = a.num_slots_m;
  const int64_t slots = a.state_k.dim(0);
  LAIR_RETURN_IF_ERROR(CheckTensor(a.q, prefix + "q", {n, h, k}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.k, prefix + "k", {n, h, k}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.v, prefix + "v", {n, h, v}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.s, prefix + "s", {n, h, m}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.g, prefix + "g", {n, h, m}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.state_k, prefix + "state_k", {slots, h, k, m}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(a.state_v, prefix + "state_v", {slots, h, m, v}, Floats::kF32));
  return CheckSequenceBatch(batch, n, slots, distinct_slots);
}

// The decay passes check the sign of g; their messages name the decay field
// (gv in pass 1), so say which GSA input it is.
absl::Status InPass(const absl::Status& status, const std::string& prefix, int pass) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, "g (decay pass ", pass,
                                                  "): ", std::string(status.message())));
}

// Rows of M logits become softmax probabilities, in place.
void SoftmaxRows(const Tensor& z, int64_t m) {
  float* data = z.f32();
  for (int64_t row = 0; row < z.numel() / m; ++row) {
    float* x = data + row * m;
    const float top = *std::max_element(x, x + m);
    float sum = 0.0f;
    for (int64_t c = 0; c < m; ++c) {
      x[c] = std::exp(x[c] - top);
      sum += x[c];
    }
    for (int64_t c = 0; c < m; ++c) x[c] /= sum;
  }
}

}  // namespace

absl::Status GsaForwardCpu(const SequenceBatch& batch, const GsaForwardArgs& args, MixerForm form,
                           int threads) {
  const std::string prefix = "GsaForwardArgs.";
  LAIR_RETURN_IF_ERROR(CheckGsaInputs(batch, args, prefix, /*distinct_slots=*/true));
  const int64_t n = args.q.dim(0), h = args.heads, m = args.num_slots_m;
  LAIR_RETURN_IF_ERROR(
      CheckTensor(args.o, prefix + "o", {n, h, int64_t{args.value_dim}}, Floats::kF32));

  // 1. Slot logits Z (a g > 0 is refused here, before any state is written).
  Tensor z = Tensor::Zeros(DType::kF32, {n, h, m});
  DecayForwardArgs pass1 = GsaKeyPass(args, args.state_k);
  pass1.o = z;
  LAIR_RETURN_IF_ERROR(InPass(DecayForwardCpu(batch, pass1, form, threads), prefix, 1));
  // 2. P = softmax(Z).
  SoftmaxRows(z, m);
  // 3. Read the value memory with P.
  DecayForwardArgs pass2 = GsaValuePass(args, z, args.state_v);
  pass2.o = args.o;
  return InPass(DecayForwardCpu(batch, pass2, form, threads), prefix, 2);
}

absl::Status GsaBackwardCpu(const SequenceBatch& batch, const GsaBackwardArgs& args, int threads) {
  const std::string prefix = "GsaBackwardArgs.fwd.";
  const GsaForwardArgs& fwd = args.fwd;
  LAIR_RETURN_IF_ERROR(CheckGsaInputs(batch, fwd, prefix, /*distinct_slots=*/false));
  const int64_t n = fwd.q.dim(0), seqs = batch.num_seqs, h = fwd.heads;
  const int64_t k = fwd.key_dim, v = fwd.value_dim, m = fwd.num_slots_m;
  const Shape slot_shape = {n, h, m};
  LAIR_RETURN_IF_ERROR(CheckTensor(args.d_o, "GsaBackwardArgs.d_o", {n, h, v}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_hkt, "GsaBackwardArgs.d_hkt", {seqs, h, k, m}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_hvt, "GsaBackwardArgs.d_hvt", {seqs, h, m, v}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dq, "GsaBackwardArgs.dq", {n, h, k}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dk, "GsaBackwardArgs.dk", {n, h, k}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dv, "GsaBackwardArgs.dv", {n, h, v}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.ds, "GsaBackwardArgs.ds", slot_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(CheckTensor(args.dg, "GsaBackwardArgs.dg", slot_shape, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_hk0, "GsaBackwardArgs.d_hk0", {seqs, h, k, m}, Floats::kF32));
  LAIR_RETURN_IF_ERROR(
      CheckOptionalTensor(args.d_hv0, "GsaBackwardArgs.d_hv0", {seqs, h, m, v}, Floats::kF32));

  // 1. P from pass 1, run on a private copy of the initial Hk (one slot per
  //    sequence) so the pool stays untouched.
  Tensor hk = Tensor::Zeros(DType::kF32, {seqs, h, k, m});
  if (!batch.zero_initial_state) {
    const int64_t per_slot = h * k * m;
    for (int64_t s = 0; s < seqs; ++s) {
      std::memcpy(hk.f32() + s * per_slot,
                  fwd.state_k.f32() + int64_t{batch.state_slot[s]} * per_slot,
                  per_slot * sizeof(float));
    }
  }
  std::vector<int32_t> own_slots(static_cast<size_t>(seqs));
  std::iota(own_slots.begin(), own_slots.end(), 0);
  SequenceBatch own = batch;
  own.state_slot = own_slots;
  own.state_slot_device = nullptr;
  own.cu_seqlens_device = nullptr;
  own.zero_initial_state = false;
  Tensor p = Tensor::Zeros(DType::kF32, slot_shape);
  DecayForwardArgs pass1 = GsaKeyPass(fwd, hk);
  pass1.o = p;
  LAIR_RETURN_IF_ERROR(InPass(DecayForwardCpu(own, pass1, MixerForm::kAuto, threads), prefix, 1));
  SoftmaxRows(p, m);

  // 2. Pass 2 backward: dP, ds (key side), dv, dg, dHv_0.
  Tensor dp = Tensor::Zeros(DType::kF32, slot_shape);
  DecayBackwardArgs back2;
  back2.fwd = GsaValuePass(fwd, p, fwd.state_v);
  back2.d_o = args.d_o;
  back2.d_ht = args.d_hvt;
  back2.dq = dp;
  back2.dk = args.ds;
  back2.dv = args.dv;
  back2.dgk = args.dg;
  back2.dh0 = args.d_hv0;
  LAIR_RETURN_IF_ERROR(
      InPass(DecayBackwardCpu(batch, back2, MixerForm::kAuto, threads), prefix, 2));

  // 3. dZ = P ⊙ (dP − <P, dP>), in place of dP.
  for (int64_t row = 0; row < n * h; ++row) {
    const float* pr = p.f32() + row * m;
    float* dr = dp.f32() + row * m;
    double dot = 0.0;
    for (int64_t c = 0; c < m; ++c) dot += double{pr[c]} * dr[c];
    for (int64_t c = 0; c < m; ++c) dr[c] = pr[c] * static_cast<float>(dr[c] - dot);
  }

  // 4. Pass 1 backward: dq, dk, ds (value side), dg, dHk_0.
  Tensor ds_value = Tensor::Zeros(DType::kF32, slot_shape);
  Tensor dg_value = Tensor::Zeros(DType::kF32, slot_shape);
  DecayBackwardArgs back1;
  back1.fwd = GsaKeyPass(fwd, fwd.state_k);
  back1.d_o = dp;
  back1.d_ht = args.d_hkt;
  back1.dq = args.dq;
  back1.dk = args.dk;
  back1.dv = ds_value;
  back1.dgv = dg_value;
  back1.dh0 = args.d_hk0;
  LAIR_RETURN_IF_ERROR(
      InPass(DecayBackwardCpu(batch, back1, MixerForm::kAuto, threads), prefix, 1));

  // 5. Both passes read s and g.
  for (int64_t e = 0; e < n * h * m; ++e) {
    args.ds.f32()[e] += ds_value.f32()[e];
    args.dg.f32()[e] += dg_value.f32()[e];
  }
  return absl::OkStatus();
}

}  // namespace lair::kernels::cpu
