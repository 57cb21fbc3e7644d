// Graph: the model code's view of kernels::Backend, with reverse-mode
// gradients.
//
// Model code (models/decoder.cc and the family files) builds every forward
// pass from these operations and nothing else, so it runs unchanged on any
// backend. Each operation runs its forward on the backend immediately and,
// when the graph records (training) and an input carries a gradient, appends
// its backward to a tape. Backward() replays the tape in reverse with the
// backends' backward ops, accumulating one gradient tensor per value.
// Parameters are the model's weights, addressed by index; ParamGrad() returns
// a parameter's gradient after Backward().
//
// Stateful operations (Conv1d, Attention, the mixers) read and update pool
// slots. Recording them requires batch.zero_initial_state and start positions
// of 0, because their backward ops reread the initial state from the pool.
// SequenceBatch spans captured by recorded operations must outlive
// Backward().
//
// Thread safety: a Graph is used by one thread; it is built per forward pass.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace lair::models {

// A value: a device tensor and, when gradients flow through it, its
// gradient slot in the graph (-1 otherwise).
struct Var {
  Tensor t;
  int grad = -1;
  const Shape& shape() const { return t.shape(); }
  int64_t dim(int axis) const { return t.dim(axis); }
};

// The tensor inputs of a decay mixer (kernels::DecayForwardArgs with Vars).
// A linear layer's parameters, weight [out, in] and bias [out] (-1: none),
// and the activation applied to its output (fused into the product where
// the backend can).
// `sixteen_bit_ok`: only ops that take 16-bit operands read the output (a
// mixer's q, k, v), so an inference graph may keep it in the backend's
// ProductOutputDType.
struct LinearWeight {
  int weight = -1;
  int bias = -1;
  kernels::Activation activation = {};
  bool sixteen_bit_ok = false;
};

// What linear layers multiply, formed from x: x itself, Norm(x) or
// silu(gate)·x (Graph::Form). A block's products take their input this way,
// so the mixer sees the residual stream x beside its norm. (Forming the input
// inside the decode GEMV, staged in shared memory, per element or as a row
// norm's scale, measured slower than this separate pass: docs/benchmarks.md.)
struct LinearInput {
  enum class Kind { kX, kNorm, kSiluMul };
  Var x;  // [N, K]
  Kind kind = Kind::kX;
  kernels::NormKind norm = kernels::NormKind::kRms;
  kernels::NormGate gate_mode = kernels::NormGate::kNone;
  float eps = 1e-6f;
  int group_size = 0;    // columns per norm; 0: the whole row
  int norm_weight = -1;  // parameter [K] or [group_size] (shared by the groups); -1: none
  Var gate = {};         // [N, K]: the norm's gate (gate_mode), or kSiluMul's

  // RMS or layer norm over whole rows with weight `norm_weight`: a block's input norm.
  static LinearInput Normed(Var x, int norm_weight, kernels::NormKind norm, float eps) {
    LinearInput in;
    in.x = std::move(x);
    in.kind = Kind::kNorm;
    in.norm = norm;
    in.eps = eps;
    in.norm_weight = norm_weight;
    return in;
  }
  // silu(gate)·x: SwiGLU.
  static LinearInput SiluMul(Var gate, Var x) {
    LinearInput in;
    in.x = std::move(x);
    in.kind = Kind::kSiluMul;
    in.gate = std::move(gate);
    return in;
  }
};

// A vector decay's gate from a low-rank input, gk = scale · log σ(z ·
// weightᵀ + bias) as [N, H, K] (GLA's gk_proj.1 with its normalizer).
struct LowRankDecayGate {
  Var z;            // [N, R]
  int weight = -1;  // parameter [H·K, R]
  int bias = -1;    // parameter [H·K], or -1: none
  float scale = 1.0f;
  // The same gate as a Linear on z, where no backend forms it.
  LinearWeight AsLinear() const { return {weight, bias, {kernels::UnaryOp::kLogSigmoid, scale}}; }
};

struct DecayInputs {
  kernels::DecayKind kind = kernels::DecayKind::kNone;
  float scale = 1.0f;
  Var q, k, v;       // [N,H,K], [N,H,K], [N,H,V]
  Tensor log_gamma;  // [H], kConstant (a constant, no gradient)
  Var g;             // [N,H], kScalar
  Var gk;            // [N,H,K], kVector
  // kVector: in place of gk. The backend forms it where it reads it, as
  // the CUDA decode step does (Backend::FormsLowRankGate), which saves a
  // launch between the projections and the step; else a Linear forms gk.
  std::optional<LowRankDecayGate> gk_low_rank;
  // Only a norm reads the output (an output product's input norm), so it
  // may be written in 16 bits where the backend rounds product outputs
  // (ProductOutputDType): half the bytes for the scan to write and the norm
  // to read.
  bool sixteen_bit_o_ok = false;
};

struct GsaInputs {
  float scale = 1.0f;
  Var q, k, v;  // [N,H,K], [N,H,K], [N,H,V]
  Var s, g;     // [N,H,M]
};

struct MlstmInputs {
  kernels::MlstmKind kind = kernels::MlstmKind::kExp;
  float eps = 1e-6f;
  Var q, k, v;  // [N,H,K], [N,H,K], [N,H,V]
  Var i, f;     // [N,H]
};

class Graph {
 public:
  // `params` (the model's weights, on `backend`) must outlive the graph, as
  // must `folded_norms` when given: folded_norms[id] is the norm weight that
  // parameter id carries in its columns (Params::ScaleColumns), or -1. The
  // products of such a weight read its norm without the norm's weight, and
  // only an inference graph may run them, under that norm.
  Graph(kernels::Backend* backend, const std::vector<Tensor>* params, bool record,
        const std::vector<int>* folded_norms = nullptr);

  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  kernels::Backend* backend() const { return backend_; }

  // Parameter `id` as a value (with a gradient slot when recording).
  Var Param(int id);
  // A constant value (no gradient).
  static Var Constant(Tensor t) { return Var{std::move(t), -1}; }

  // --- Operations (shapes as in kernels/dense.h) ---------------------------
  // x [..., in] · weight[out, in]ᵀ (+ bias[out]) → [..., out]. bias_id < 0: none.
  absl::StatusOr<Var> Linear(const Var& x, int weight_id, int bias_id = -1);
  absl::StatusOr<Var> Linear(const Var& x, const LinearWeight& weight);
  // Several linear layers of the same input, as one backend LinearGroup
  // (one launch where the backend can); one value per weight, in order.
  absl::StatusOr<std::vector<Var>> Linears(const Var& x, std::span<const LinearWeight> weights);
  absl::StatusOr<std::vector<Var>> Linears(const LinearInput& in,
                                           std::span<const LinearWeight> weights);
  // One linear layer of a formed input, plus `residual` (same shape as the
  // output) when defined: a block's last product joining the residual stream.
  absl::StatusOr<Var> Linear(const LinearInput& in, const LinearWeight& weight,
                             const Var& residual = {});
  // A SwiGLU MLP of the formed input: (silu(in·gateᵀ) ∘ (in·upᵀ))·downᵀ plus
  // `residual` when defined (one backend SwiGlu op when not recording).
  absl::StatusOr<Var> SwiGlu(const LinearInput& in, int gate_id, int up_id, int down_id,
                             const Var& residual = {});
  // The input `in` describes, computed.
  absl::StatusOr<Var> Form(const LinearInput& in);
  // op(a) · op(b) for rank-2 values.
  absl::StatusOr<Var> MatMul(const Var& a, const Var& b, bool trans_a, bool trans_b);
  // Rows of `table` (a parameter) picked by `ids` [N] I32 → [N, D].
  absl::StatusOr<Var> Embedding(int table_id, const Tensor& ids);
  // Rows of an activation picked by `ids` (no gradient: inference only).
  absl::StatusOr<Var> GatherRows(const Var& x, const Tensor& ids);
  // Norm over groups of the last dimension; weight_id < 0: no weight; `gate`
  // (same shape as x) used unless gate_mode is kNone.
  absl::StatusOr<Var> Norm(const Var& x, int weight_id, kernels::NormKind kind, float eps,
                           int group_size = 0,
                           kernels::NormGate gate_mode = kernels::NormGate::kNone,
                           const Var& gate = {});
  // alpha · f(in_scale · x) + beta.
  absl::StatusOr<Var> Unary(kernels::UnaryOp op, const Var& x, float alpha = 1.0f,
                            float beta = 0.0f, float in_scale = 1.0f);
  // x broadcast to `shape` (dimensions of x equal to shape's or 1).
  absl::StatusOr<Var> Expand(const Var& x, const Shape& shape);
  // a ∘ b, broadcasting both to the larger shape.
  absl::StatusOr<Var> Binary(kernels::BinaryOp op, const Var& a, const Var& b);
  absl::StatusOr<Var> Add(const Var& a, const Var& b) {
    return Binary(kernels::BinaryOp::kAdd, a, b);
  }
  absl::StatusOr<Var> Mul(const Var& a, const Var& b) {
    return Binary(kernels::BinaryOp::kMul, a, b);
  }
  // Columns [begin, begin + width) of the last dimension, as [..., width].
  absl::StatusOr<Var> Columns(const Var& x, int64_t begin, int64_t width);
  // The same data under another shape.
  Var Reshape(const Var& x, Shape shape);

  // Stateful operations over a packed batch (state pools from a StatePool).
  absl::StatusOr<Var> Conv1d(const kernels::SequenceBatch& batch, const Var& x, int weight_id,
                             int bias_id, bool silu, const Tensor& state);
  absl::StatusOr<Var> Rotary(const Var& x, const Tensor& positions, int rotary_dim, float theta);
  absl::StatusOr<Var> Attention(const kernels::SequenceBatch& batch, const Var& q, const Var& k,
                                const Var& v, float scale, const Tensor& k_cache,
                                const Tensor& v_cache, std::span<const int32_t> start_positions,
                                const int32_t* start_positions_device = nullptr);
  absl::StatusOr<Var> Decay(const kernels::SequenceBatch& batch, const DecayInputs& in,
                            const Tensor& state, kernels::MixerForm form);
  // Whether a decay of `batch` should read a low-rank gate (gate_weight, its
  // second product [heads·key_dim, R]) through the fused weight its mixer
  // derived (Mixer::FuseLowRankGate): an inference graph's decode step (one
  // token per sequence) whose backend would not form the gate itself
  // (Backend::FormsLowRankGate), so that Decay would run the gate's small
  // product as a launch of its own.
  bool ReadsFusedGate(const kernels::SequenceBatch& batch, int gate_weight, int heads, int key_dim,
                      int value_dim, kernels::MixerForm form) const;
  absl::StatusOr<Var> Gsa(const kernels::SequenceBatch& batch, const GsaInputs& in,
                          const Tensor& state_k, const Tensor& state_v, kernels::MixerForm form);
  absl::StatusOr<Var> Mlstm(const kernels::SequenceBatch& batch, const MlstmInputs& in,
                            const Tensor& state_c, const Tensor& state_n, const Tensor& state_m,
                            kernels::MixerForm form);

  // Sum over rows of the cross-entropy of `logits` [N,V] against `targets`
  // [N] I32; when recording, seeds logits' gradient with grad_scale · dL/dlogits.
  absl::StatusOr<double> CrossEntropy(const Var& logits, const Tensor& targets, float grad_scale);

  // Runs the tape backwards. REQUIRES: recording, CrossEntropy called.
  absl::Status Backward();
  // Parameter `id`'s gradient after Backward(); undefined when none reached it.
  Tensor ParamGrad(int id) const;

 private:
  absl::StatusOr<Tensor> New(const Shape& shape, DType dtype = DType::kF32);
  // A gradient slot for a new value when recording and any input has one.
  int NewGrad(std::initializer_list<const Var*> inputs);
  // Adds `grad` into slot `id` (taking it over when the slot is empty and
  // `owned`; copying it otherwise).
  absl::Status Accumulate(int id, const Tensor& grad, bool owned);
  // The broadcast-reduced gradient of a value of shape `shape` from `grad`.
  absl::StatusOr<Tensor> ReduceTo(const Tensor& grad, const Shape& shape);
  // The tape entry of y = x2 · wᵀ (+ b), x2 being x as [rows, in].
  void RecordLinearBackward(const Var& x, const Tensor& x2, const Var& w, const Var& b,
                            const Var& y);
  void Record(std::function<absl::Status()> backward) { tape_.push_back(std::move(backward)); }
  // `in`'s norm for a backend to form (LinearGroupArgs::input_norm), when
  // not recording; unset otherwise. Without its weight when the products'
  // weights carry it; an error when only some do, or under another input.
  absl::StatusOr<std::optional<kernels::NormArgs>> NormInProduct(
      const LinearInput& in, std::span<const int> weight_ids) const;
  // The norm weight parameter `id` carries in its columns, or -1.
  int FoldedNormOf(int id) const { return folded_norms_ ? (*folded_norms_)[id] : -1; }
  // The products of Form(in) by `weights` (one LinearGroup), each plus its
  // residual when given.
  absl::StatusOr<std::vector<Var>> Products(const LinearInput& in,
                                            std::span<const LinearWeight> weights,
                                            std::span<const Var> residuals);

  kernels::Backend* backend_;
  const std::vector<Tensor>* params_;
  bool record_;
  const std::vector<int>* folded_norms_;
  std::vector<int> param_grads_;  // parameter id -> gradient slot (-1: none yet)
  std::vector<Tensor> grads_;     // gradient slot -> accumulated gradient (may be undefined)
  std::vector<std::function<absl::Status()>> tape_;
};

}  // namespace lair::models
