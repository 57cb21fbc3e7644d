#include "models/graph.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace lair::models {

using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

// [rows, last dimension] view of a value.
Tensor As2d(const Tensor& t) {
  int64_t cols = t.rank() == 0 ? 1 : t.dim(-1);
  return t.Reshape({cols == 0 ? 0 : t.numel() / cols, cols});
}

kernels::GemmArgs GemmOf(Tensor a, Tensor b, Tensor c, bool trans_a, bool trans_b,
                         float alpha = 1.0f, float beta = 0.0f, Tensor bias = Tensor()) {
  return kernels::GemmArgs{std::move(a), std::move(b), std::move(c), trans_a,
                           trans_b,      alpha,        beta,         std::move(bias)};
}

Shape WithLast(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace

Graph::Graph(kernels::Backend* backend, const std::vector<Tensor>* params, bool record,
             const std::vector<int>* folded_norms)
    : backend_(backend),
      params_(params),
      record_(record),
      folded_norms_(folded_norms),
      param_grads_(params->size(), -1) {}

Var Graph::Param(int id) {
  LAIR_CHECK(id >= 0 && id < static_cast<int>(params_->size()));
  int grad = -1;
  if (record_) {
    if (param_grads_[id] < 0) {
      param_grads_[id] = static_cast<int>(grads_.size());
      grads_.emplace_back();
    }
    grad = param_grads_[id];
  }
  return Var{(*params_)[id], grad};
}

// A forward-only graph's values are overwritten whole by the op that makes
// them (and live in the step arena); gradients may be accumulated into, so
// a recording graph's are zeroed.
absl::StatusOr<Tensor> Graph::New(const Shape& shape, DType dtype) {
  return record_ ? backend_->Allocate(dtype, shape) : backend_->AllocateScratch(dtype, shape);
}

int Graph::NewGrad(std::initializer_list<const Var*> inputs) {
  if (!record_) return -1;
  for (const Var* v : inputs) {
    if (v->grad >= 0) {
      grads_.emplace_back();
      return static_cast<int>(grads_.size()) - 1;
    }
  }
  return -1;
}

absl::Status Graph::Accumulate(int id, const Tensor& grad, bool owned) {
  if (id < 0) return absl::OkStatus();
  Tensor& slot = grads_[id];
  if (!slot.defined()) {
    if (owned) {
      slot = grad;
      return absl::OkStatus();
    }
    LAIR_ASSIGN_OR_RETURN(slot, New(grad.shape()));
    return backend_->Copy(grad, slot);
  }
  return backend_->Binary({BinaryOp::kAdd, slot, grad.Reshape(slot.shape()), slot});
}

absl::StatusOr<Tensor> Graph::ReduceTo(const Tensor& grad, const Shape& shape) {
  LAIR_ASSIGN_OR_RETURN(Tensor out, New(shape));
  LAIR_RETURN_IF_ERROR(backend_->ReduceSum({grad, out}));
  return out;
}

Tensor Graph::ParamGrad(int id) const {
  int slot = param_grads_[id];
  return slot < 0 ? Tensor() : grads_[slot];
}

absl::Status Graph::Backward() {
  if (!record_)
    return absl::FailedPreconditionError("Graph::Backward on a graph that does not record");
  for (auto it = tape_.rbegin(); it != tape_.rend(); ++it) LAIR_RETURN_IF_ERROR((*it)());
  return absl::OkStatus();
}

// The gradient of the value in slot `id`, as `shape`; undefined when none.
#define LAIR_GRAD_OR_SKIP(var, id, shape)                     \
  if (grads_[id].defined() == false) return absl::OkStatus(); \
  Tensor var = grads_[id].Reshape(shape)

absl::StatusOr<Var> Graph::Linear(const Var& x, int weight_id, int bias_id) {
  return Linear(x, LinearWeight{weight_id, bias_id});
}

absl::StatusOr<Var> Graph::Linear(const Var& x, const LinearWeight& weight) {
  LAIR_ASSIGN_OR_RETURN(std::vector<Var> out, Linears(x, {&weight, 1}));
  return std::move(out.front());
}

absl::StatusOr<std::vector<Var>> Graph::Linears(const Var& x,
                                                std::span<const LinearWeight> weights) {
  LinearInput in;
  in.x = x;
  return Products(in, weights, {});
}

absl::StatusOr<std::vector<Var>> Graph::Linears(const LinearInput& in,
                                                std::span<const LinearWeight> weights) {
  return Products(in, weights, {});
}

absl::StatusOr<Var> Graph::Linear(const LinearInput& in, const LinearWeight& weight,
                                  const Var& residual) {
  LAIR_ASSIGN_OR_RETURN(std::vector<Var> out, Products(in, {&weight, 1}, {&residual, 1}));
  return std::move(out.front());
}

absl::StatusOr<Var> Graph::Form(const LinearInput& in) {
  switch (in.kind) {
    case LinearInput::Kind::kX:
      return in.x;
    case LinearInput::Kind::kSiluMul:
      return Binary(BinaryOp::kSiluMul, in.gate, in.x);
    case LinearInput::Kind::kNorm:
      break;
  }
  return Norm(in.x, in.norm_weight, in.norm, in.eps, in.group_size, in.gate_mode, in.gate);
}

absl::StatusOr<std::optional<kernels::NormArgs>> Graph::NormInProduct(
    const LinearInput& in, std::span<const int> weight_ids) const {
  const bool normed = in.kind == LinearInput::Kind::kNorm;
  size_t folded = 0;
  for (int id : weight_ids) {
    const int norm = FoldedNormOf(id);
    if (norm < 0) continue;
    if (record_ || !normed || norm != in.norm_weight) {
      return absl::InternalError(absl::StrCat(
          "parameter ", id, " carries norm weight ", norm, " in its columns but is read ",
          record_ ? "by a recording graph" : "under another input"));
    }
    ++folded;
  }
  if (folded != 0 && folded != weight_ids.size()) {
    return absl::InternalError(absl::StrCat("products under norm weight ", in.norm_weight,
                                            " whose weights carry it only in part"));
  }
  if (record_ || !normed) return std::nullopt;
  kernels::NormArgs norm;
  norm.kind = in.norm;
  norm.gate_mode = in.gate_mode;
  norm.eps = in.eps;
  norm.group_size = in.group_size;
  if (in.norm_weight >= 0 && folded == 0) norm.weight = (*params_)[in.norm_weight];
  if (kernels::NormHasGate(in.gate_mode)) norm.gate = As2d(in.gate.t);
  return norm;
}

absl::StatusOr<Var> Graph::SwiGlu(const LinearInput& in, int gate_id, int up_id, int down_id,
                                  const Var& residual) {
  if (record_) {
    const LinearWeight gate_up[] = {{gate_id}, {up_id}};
    LAIR_ASSIGN_OR_RETURN(std::vector<Var> proj, Linears(in, gate_up));
    return Linear(LinearInput::SiluMul(proj[0], proj[1]), {down_id}, residual);
  }
  kernels::SwiGluArgs args;
  const int gate_up[] = {gate_id, up_id};
  LAIR_ASSIGN_OR_RETURN(args.input_norm, NormInProduct(in, gate_up));
  if (FoldedNormOf(down_id) >= 0) {
    return absl::InternalError(absl::StrCat("parameter ", down_id, " carries a norm weight but ",
                                            "is read under SwiGLU's gate"));
  }
  Var x = in.x;
  if (!args.input_norm) {
    LAIR_ASSIGN_OR_RETURN(x, Form(in));
  }
  args.x = As2d(x.t);
  args.w_gate = (*params_)[gate_id];
  args.w_up = (*params_)[up_id];
  args.w_down = (*params_)[down_id];
  if (residual.t.defined()) args.residual = As2d(residual.t);
  LAIR_ASSIGN_OR_RETURN(args.out, New({args.x.dim(0), args.w_down.dim(0)}));
  LAIR_RETURN_IF_ERROR(backend_->SwiGlu(args));
  return Var{args.out.Reshape(WithLast(x.shape(), args.w_down.dim(0))), -1};
}

absl::StatusOr<std::vector<Var>> Graph::Products(const LinearInput& in,
                                                 std::span<const LinearWeight> weights,
                                                 std::span<const Var> residuals) {
  // An inference graph hands SwiGLU's silu(gate)·x and norms (a block's
  // input norm, a mixer's per-head output norm) to the backend unformed
  // (LinearGroupArgs::silu_gate, input_norm), which may form them as it
  // loads x or rounds it for its tensor cores.
  const bool gate_in_product = !record_ && in.kind == LinearInput::Kind::kSiluMul;
  std::vector<int> weight_ids;
  for (const LinearWeight& weight : weights) weight_ids.push_back(weight.weight);
  LAIR_ASSIGN_OR_RETURN(std::optional<kernels::NormArgs> norm, NormInProduct(in, weight_ids));
  Var x = in.x;
  if (!gate_in_product && !norm) {
    LAIR_ASSIGN_OR_RETURN(x, Form(in));
  }
  const Tensor x2 = As2d(x.t);
  std::vector<Var> w, b;
  std::vector<Tensor> w_t, b_t, y_t, r_t;
  std::vector<kernels::Activation> activations;
  for (const LinearWeight& weight : weights) {
    w.push_back(Param(weight.weight));
    b.push_back(weight.bias >= 0 ? Param(weight.bias) : Var{});
    w_t.push_back(w.back().t);
    b_t.push_back(b.back().t);
    const bool rounded = !record_ && weight.sixteen_bit_ok &&
                         (residuals.size() <= y_t.size() || !residuals[y_t.size()].t.defined());
    const DType dtype = rounded ? backend_->ProductOutputDType(x2.dim(0)) : DType::kF32;
    LAIR_ASSIGN_OR_RETURN(Tensor y, New({x2.dim(0), w.back().dim(0)}, dtype));
    y_t.push_back(std::move(y));
    activations.push_back(weight.activation);
  }
  // A recording graph applies the activations and adds the residuals as
  // Unary and Add ops, which keep what their backward needs.
  kernels::LinearGroupArgs args{x2, w_t, b_t, y_t};
  if (gate_in_product) args.silu_gate = As2d(in.gate.t);
  args.input_norm = std::move(norm);
  if (!record_) {
    args.activations = activations;
    for (const Var& r : residuals) r_t.push_back(r.t.defined() ? As2d(r.t) : Tensor());
    args.residuals = r_t;
  }
  LAIR_RETURN_IF_ERROR(backend_->LinearGroup(args));
  std::vector<Var> out;
  for (size_t i = 0; i < weights.size(); ++i) {
    out.push_back(
        Var{y_t[i].Reshape(WithLast(x.shape(), w[i].dim(0))), NewGrad({&x, &w[i], &b[i]})});
    if (out.back().grad >= 0) RecordLinearBackward(x, x2, w[i], b[i], out.back());
    if (!record_) continue;
    const kernels::Activation& act = weights[i].activation;
    if (!act.identity()) {
      LAIR_ASSIGN_OR_RETURN(out.back(),
                            Unary(act.op, out.back(), act.alpha, act.beta, act.in_scale));
    }
    if (i < residuals.size() && residuals[i].t.defined()) {
      LAIR_ASSIGN_OR_RETURN(out.back(), Add(residuals[i], out.back()));
    }
  }
  return out;
}

void Graph::RecordLinearBackward(const Var& x, const Tensor& x2, const Var& w, const Var& b,
                                 const Var& y) {
  Record([this, x, x2, w, b, y_shape = Shape{x2.dim(0), w.dim(0)}, id = y.grad]() -> absl::Status {
    LAIR_GRAD_OR_SKIP(dy, id, y_shape);
    if (x.grad >= 0) {
      LAIR_ASSIGN_OR_RETURN(Tensor dx, New(x2.shape()));
      LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(dy, w.t, dx, false, false)));
      LAIR_RETURN_IF_ERROR(Accumulate(x.grad, dx, true));
    }
    if (w.grad >= 0) {
      if (!grads_[w.grad].defined()) {
        LAIR_ASSIGN_OR_RETURN(grads_[w.grad], New(w.shape()));
      }
      LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(dy, x2, grads_[w.grad], true, false, 1.0f, 1.0f)));
    }
    if (b.grad >= 0) {
      LAIR_ASSIGN_OR_RETURN(Tensor db, ReduceTo(dy, {1, b.dim(0)}));
      LAIR_RETURN_IF_ERROR(Accumulate(b.grad, db.Reshape(b.shape()), true));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Var> Graph::MatMul(const Var& a, const Var& b, bool trans_a, bool trans_b) {
  if (a.t.rank() != 2 || b.t.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: rank-2 operands expected, got ",
                                                   a.t.DebugString(), " and ", b.t.DebugString()));
  }
  int64_t m = trans_a ? a.dim(1) : a.dim(0);
  int64_t n = trans_b ? b.dim(0) : b.dim(1);
  LAIR_ASSIGN_OR_RETURN(Tensor y, New({m, n}));
  LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(a.t, b.t, y, trans_a, trans_b)));
  Var out{y, NewGrad({&a, &b})};
  if (out.grad >= 0) {
    Record([this, a, b, trans_a, trans_b, y_shape = y.shape(), id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, y_shape);
      if (a.grad >= 0) {
        LAIR_ASSIGN_OR_RETURN(Tensor da, New(a.shape()));
        if (!trans_a) {
          LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(dy, b.t, da, false, !trans_b)));
        } else {
          LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(b.t, dy, da, trans_b, true)));
        }
        LAIR_RETURN_IF_ERROR(Accumulate(a.grad, da, true));
      }
      if (b.grad >= 0) {
        LAIR_ASSIGN_OR_RETURN(Tensor db, New(b.shape()));
        if (!trans_b) {
          LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(a.t, dy, db, !trans_a, false)));
        } else {
          LAIR_RETURN_IF_ERROR(backend_->Gemm(GemmOf(dy, a.t, db, true, trans_a)));
        }
        LAIR_RETURN_IF_ERROR(Accumulate(b.grad, db, true));
      }
      return absl::OkStatus();
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Embedding(int table_id, const Tensor& ids) {
  Var table = Param(table_id);
  LAIR_ASSIGN_OR_RETURN(Tensor y, New({ids.numel(), table.dim(1)}));
  LAIR_RETURN_IF_ERROR(backend_->Embedding({table.t, ids, y}));
  Var out{y, NewGrad({&table})};
  if (out.grad >= 0) {
    Record([this, table, ids, y_shape = y.shape(), id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, y_shape);
      if (!grads_[table.grad].defined()) {
        LAIR_ASSIGN_OR_RETURN(grads_[table.grad], New(table.shape()));
      }
      return backend_->EmbeddingBackward({ids, dy, grads_[table.grad]});
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::GatherRows(const Var& x, const Tensor& ids) {
  if (x.grad >= 0) return absl::InternalError("GatherRows does not propagate gradients");
  Tensor x2 = As2d(x.t);
  LAIR_ASSIGN_OR_RETURN(Tensor y, New({ids.numel(), x2.dim(1)}));
  LAIR_RETURN_IF_ERROR(backend_->Embedding({x2, ids, y}));
  return Var{y, -1};
}

absl::StatusOr<Var> Graph::Norm(const Var& x, int weight_id, kernels::NormKind kind, float eps,
                                int group_size, kernels::NormGate gate_mode, const Var& gate) {
  Var w = weight_id >= 0 ? Param(weight_id) : Var{};
  kernels::NormArgs args;
  args.kind = kind;
  args.gate_mode = gate_mode;
  args.eps = eps;
  args.group_size = group_size;
  args.x = As2d(x.t);
  args.weight = w.t;
  if (kernels::NormHasGate(gate_mode)) args.gate = As2d(gate.t);
  LAIR_ASSIGN_OR_RETURN(args.y, New(args.x.shape()));
  LAIR_RETURN_IF_ERROR(backend_->Norm(args));
  Var out{args.y.Reshape(x.shape()), NewGrad({&x, &w, &gate})};
  if (out.grad >= 0) {
    Record([this, args, x, w, gate, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, args.x.shape());
      kernels::NormBackwardArgs back;
      back.fwd = args;
      back.d_y = dy;
      LAIR_ASSIGN_OR_RETURN(back.dx, New(args.x.shape()));
      if (w.grad >= 0) {
        if (!grads_[w.grad].defined()) {
          LAIR_ASSIGN_OR_RETURN(grads_[w.grad], New(w.shape()));
        }
        back.d_weight = grads_[w.grad];
      }
      if (gate.grad >= 0) {
        LAIR_ASSIGN_OR_RETURN(back.d_gate, New(args.x.shape()));
      }
      LAIR_RETURN_IF_ERROR(backend_->NormBackward(back));
      LAIR_RETURN_IF_ERROR(Accumulate(x.grad, back.dx, true));
      if (gate.grad >= 0) LAIR_RETURN_IF_ERROR(Accumulate(gate.grad, back.d_gate, true));
      return absl::OkStatus();
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Unary(UnaryOp op, const Var& x, float alpha, float beta,
                                 float in_scale) {
  kernels::UnaryArgs args{op, alpha, beta, in_scale, x.t, Tensor()};
  LAIR_ASSIGN_OR_RETURN(args.y, New(x.shape()));
  LAIR_RETURN_IF_ERROR(backend_->Unary(args));
  Var out{args.y, NewGrad({&x})};
  if (out.grad >= 0) {
    Record([this, args, x, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, x.shape());
      kernels::UnaryBackwardArgs back{args, dy, Tensor()};
      LAIR_ASSIGN_OR_RETURN(back.dx, New(x.shape()));
      LAIR_RETURN_IF_ERROR(backend_->UnaryBackward(back));
      return Accumulate(x.grad, back.dx, true);
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Expand(const Var& x, const Shape& shape) {
  LAIR_ASSIGN_OR_RETURN(Tensor y, New(shape));
  LAIR_RETURN_IF_ERROR(backend_->Unary({UnaryOp::kAffine, 1.0f, 0.0f, 1.0f, x.t, y}));
  Var out{y, NewGrad({&x})};
  if (out.grad >= 0) {
    Record([this, x, shape, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, shape);
      LAIR_ASSIGN_OR_RETURN(Tensor dx, ReduceTo(dy, x.shape()));
      return Accumulate(x.grad, dx, true);
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Binary(BinaryOp op, const Var& a, const Var& b) {
  if (a.t.rank() != b.t.rank()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Binary: operands of different rank: ", a.t.DebugString(), ", ", b.t.DebugString()));
  }
  if (op == BinaryOp::kSiluMul && a.shape() != b.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Binary: silu-mul operands differ in shape: ", a.t.DebugString(), ", ", b.t.DebugString()));
  }
  Shape shape = a.shape();
  for (size_t d = 0; d < shape.size(); ++d) shape[d] = std::max(shape[d], b.shape()[d]);
  LAIR_ASSIGN_OR_RETURN(Tensor y, New(shape));
  LAIR_RETURN_IF_ERROR(backend_->Binary({op, a.t, b.t, y}));
  Var out{y, NewGrad({&a, &b})};
  if (out.grad >= 0) {
    Record([this, op, a, b, y, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, y.shape());
      // d(result)/d(operand) as an elementwise factor on dy, then reduced.
      auto grad_for = [&](const Var& operand, const Var& other, bool is_a) -> absl::Status {
        if (operand.grad < 0) return absl::OkStatus();
        Tensor g = dy;
        bool fresh = false;
        if (op == BinaryOp::kSiluMul) {
          // y = silu(a)·b: dy·b·silu'(a) for a, dy·silu(a) for b.
          LAIR_ASSIGN_OR_RETURN(g, New(y.shape()));
          fresh = true;
          if (is_a) {
            LAIR_ASSIGN_OR_RETURN(Tensor dy_b, New(y.shape()));
            LAIR_RETURN_IF_ERROR(backend_->Binary({BinaryOp::kMul, dy, b.t, dy_b}));
            LAIR_RETURN_IF_ERROR(backend_->UnaryBackward(
                {kernels::UnaryArgs{UnaryOp::kSilu, 1.0f, 0.0f, 1.0f, a.t, Tensor()}, dy_b, g}));
          } else {
            LAIR_RETURN_IF_ERROR(backend_->Unary({UnaryOp::kSilu, 1.0f, 0.0f, 1.0f, a.t, g}));
            LAIR_RETURN_IF_ERROR(backend_->Binary({BinaryOp::kMul, g, dy, g}));
          }
        } else if (op == BinaryOp::kMul || op == BinaryOp::kDiv) {
          LAIR_ASSIGN_OR_RETURN(g, New(y.shape()));
          fresh = true;
          if (op == BinaryOp::kMul) {
            LAIR_RETURN_IF_ERROR(backend_->Binary({BinaryOp::kMul, dy, other.t, g}));
          } else if (is_a) {
            LAIR_RETURN_IF_ERROR(backend_->Binary({BinaryOp::kDiv, dy, b.t, g}));
          } else {  // d(a/b)/db = -y / b
            LAIR_RETURN_IF_ERROR(backend_->Binary({BinaryOp::kMul, dy, y, g}));
            LAIR_RETURN_IF_ERROR(backend_->Binary({BinaryOp::kDiv, g, b.t, g}));
            LAIR_RETURN_IF_ERROR(backend_->Unary({UnaryOp::kAffine, -1.0f, 0.0f, 1.0f, g, g}));
          }
        } else if (op == BinaryOp::kSub && !is_a) {
          LAIR_ASSIGN_OR_RETURN(g, New(y.shape()));
          fresh = true;
          LAIR_RETURN_IF_ERROR(backend_->Unary({UnaryOp::kAffine, -1.0f, 0.0f, 1.0f, dy, g}));
        }
        if (g.shape() != operand.shape()) {
          LAIR_ASSIGN_OR_RETURN(g, ReduceTo(g, operand.shape()));
          fresh = true;
        }
        return Accumulate(operand.grad, g, fresh);
      };
      LAIR_RETURN_IF_ERROR(grad_for(a, b, true));
      return grad_for(b, a, false);
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Columns(const Var& x, int64_t begin, int64_t width) {
  Shape shape = WithLast(x.shape(), width);
  LAIR_ASSIGN_OR_RETURN(Tensor y, New(shape));
  LAIR_RETURN_IF_ERROR(backend_->CopyColumns({x.t, begin, y, 0, width, false}));
  Var out{y, NewGrad({&x})};
  if (out.grad >= 0) {
    Record([this, x, begin, width, shape, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, shape);
      LAIR_ASSIGN_OR_RETURN(Tensor dx, New(x.shape()));
      LAIR_RETURN_IF_ERROR(backend_->CopyColumns({dy, 0, dx, begin, width, false}));
      return Accumulate(x.grad, dx, true);
    });
  }
  return out;
}

Var Graph::Reshape(const Var& x, Shape shape) { return Var{x.t.Reshape(std::move(shape)), x.grad}; }

namespace {

absl::Status RequireTrainable(const kernels::SequenceBatch& batch, std::string_view op) {
  if (batch.zero_initial_state) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(std::string(op), ": gradients need batch.zero_initial_state"));
}

}  // namespace

absl::StatusOr<Var> Graph::Conv1d(const kernels::SequenceBatch& batch, const Var& x, int weight_id,
                                  int bias_id, bool silu, const Tensor& state) {
  Var w = Param(weight_id);
  Var b = bias_id >= 0 ? Param(bias_id) : Var{};
  // A depthwise nn.Conv1d stores its weight as [C, 1, W].
  Tensor w2 = w.t.Reshape({w.dim(0), w.t.numel() / w.dim(0)});
  kernels::Conv1dArgs args{x.t, w2, b.t, silu, Tensor(), state};
  LAIR_ASSIGN_OR_RETURN(args.y, New(x.shape()));
  LAIR_RETURN_IF_ERROR(backend_->Conv1d(batch, args));
  Var out{args.y, NewGrad({&x, &w, &b})};
  if (out.grad >= 0) {
    LAIR_RETURN_IF_ERROR(RequireTrainable(batch, "Conv1d"));
    Record([this, batch, args, x, w, b, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, x.shape());
      kernels::Conv1dBackwardArgs back{args, dy, Tensor(), Tensor(), Tensor()};
      LAIR_ASSIGN_OR_RETURN(back.dx, New(x.shape()));
      LAIR_ASSIGN_OR_RETURN(back.d_weight, New(args.weight.shape()));
      if (b.t.defined()) {
        LAIR_ASSIGN_OR_RETURN(back.d_bias, New(b.shape()));
      }
      LAIR_RETURN_IF_ERROR(backend_->Conv1dBackward(batch, back));
      LAIR_RETURN_IF_ERROR(Accumulate(x.grad, back.dx, true));
      LAIR_RETURN_IF_ERROR(Accumulate(w.grad, back.d_weight, true));
      return Accumulate(b.grad, back.d_bias, true);
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Rotary(const Var& x, const Tensor& positions, int rotary_dim,
                                  float theta) {
  kernels::RotaryArgs args;
  args.rotary_dim = rotary_dim;
  args.theta = theta;
  args.x = x.t;
  args.positions = positions;
  LAIR_ASSIGN_OR_RETURN(args.y, New(x.shape()));
  LAIR_RETURN_IF_ERROR(backend_->Rotary(args));
  Var out{args.y, NewGrad({&x})};
  if (out.grad >= 0) {
    Record([this, args, x, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, x.shape());
      kernels::RotaryArgs back = args;
      back.inverse = true;
      back.x = dy;
      LAIR_ASSIGN_OR_RETURN(back.y, New(x.shape()));
      LAIR_RETURN_IF_ERROR(backend_->Rotary(back));
      return Accumulate(x.grad, back.y, true);
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Attention(const kernels::SequenceBatch& batch, const Var& q,
                                     const Var& k, const Var& v, float scale, const Tensor& k_cache,
                                     const Tensor& v_cache,
                                     std::span<const int32_t> start_positions,
                                     const int32_t* start_positions_device) {
  kernels::AttentionArgs args;
  args.heads = static_cast<int>(q.dim(1));
  args.kv_heads = static_cast<int>(k.dim(1));
  args.head_dim = static_cast<int>(q.dim(2));
  args.scale = scale;
  args.q = q.t;
  args.k = k.t;
  args.v = v.t;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.start_positions = start_positions;
  args.start_positions_device = start_positions_device;
  LAIR_ASSIGN_OR_RETURN(args.o, New(q.shape()));
  LAIR_RETURN_IF_ERROR(backend_->Attention(batch, args));
  Var out{args.o, NewGrad({&q, &k, &v})};
  if (out.grad >= 0) {
    Record([this, batch, args, q, k, v, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, q.shape());
      kernels::AttentionBackwardArgs back;
      back.fwd = args;
      back.d_o = dy;
      LAIR_ASSIGN_OR_RETURN(back.dq, New(q.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dk, New(k.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dv, New(v.shape()));
      LAIR_RETURN_IF_ERROR(backend_->AttentionBackward(batch, back));
      LAIR_RETURN_IF_ERROR(Accumulate(q.grad, back.dq, true));
      LAIR_RETURN_IF_ERROR(Accumulate(k.grad, back.dk, true));
      return Accumulate(v.grad, back.dv, true);
    });
  }
  return out;
}

bool Graph::ReadsFusedGate(const kernels::SequenceBatch& batch, int gate_weight, int heads,
                           int key_dim, int value_dim, kernels::MixerForm form) const {
  // A decode step as the decoder tells one (every sequence has a token).
  if (record_ || batch.max_seqlen != 1) return false;
  kernels::DecayForwardArgs args;
  args.kind = kernels::DecayKind::kVector;
  args.heads = heads;
  args.key_dim = key_dim;
  args.value_dim = value_dim;
  args.gk_low_rank.weight = (*params_)[gate_weight];
  return !backend_->FormsLowRankGate(batch, args, form);
}

absl::StatusOr<Var> Graph::Decay(const kernels::SequenceBatch& batch, const DecayInputs& given,
                                 const Tensor& state, kernels::MixerForm form) {
  DecayInputs in = given;
  kernels::DecayForwardArgs args;
  args.kind = in.kind;
  args.heads = static_cast<int>(in.q.dim(1));
  args.key_dim = static_cast<int>(in.q.dim(2));
  args.value_dim = static_cast<int>(in.v.dim(2));
  args.scale = in.scale;
  args.q = in.q.t;
  args.k = in.k.t;
  args.v = in.v.t;
  args.log_gamma = in.log_gamma;
  args.g = in.g.t;
  args.state = state;
  if (in.gk_low_rank) {
    const LowRankDecayGate& gate = *in.gk_low_rank;
    args.gk_low_rank = {As2d(gate.z.t), (*params_)[gate.weight],
                        gate.bias >= 0 ? (*params_)[gate.bias] : Tensor(), gate.scale};
    if (record_ || !backend_->FormsLowRankGate(batch, args, form)) {
      args.gk_low_rank = {};
      LAIR_ASSIGN_OR_RETURN(Var gk, Linear(gate.z, gate.AsLinear()));
      in.gk = Reshape(gk, {gk.dim(0), args.heads, args.key_dim});
    }
  }
  args.gk = in.gk.t;
  const bool rounded = !record_ && in.sixteen_bit_o_ok;
  LAIR_ASSIGN_OR_RETURN(
      args.o, New(in.v.shape(), rounded ? backend_->ProductOutputDType(in.v.dim(0)) : DType::kF32));
  LAIR_RETURN_IF_ERROR(backend_->DecayForward(batch, args, form));
  Var out{args.o, NewGrad({&in.q, &in.k, &in.v, &in.g, &in.gk})};
  if (out.grad >= 0) {
    LAIR_RETURN_IF_ERROR(RequireTrainable(batch, "Decay"));
    Record([this, batch, args, in, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, in.v.shape());
      kernels::DecayBackwardArgs back;
      back.fwd = args;
      back.d_o = dy;
      LAIR_ASSIGN_OR_RETURN(back.dq, New(in.q.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dk, New(in.k.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dv, New(in.v.shape()));
      if (args.kind == kernels::DecayKind::kConstant) {
        LAIR_ASSIGN_OR_RETURN(back.d_log_gamma, New(args.log_gamma.shape()));
      }
      if (args.kind == kernels::DecayKind::kScalar) {
        LAIR_ASSIGN_OR_RETURN(back.dg, New(in.g.shape()));
      }
      if (args.kind == kernels::DecayKind::kVector) {
        LAIR_ASSIGN_OR_RETURN(back.dgk, New(in.gk.shape()));
      }
      LAIR_RETURN_IF_ERROR(backend_->DecayBackward(batch, back));
      LAIR_RETURN_IF_ERROR(Accumulate(in.q.grad, back.dq, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.k.grad, back.dk, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.v.grad, back.dv, true));
      if (back.dg.defined()) LAIR_RETURN_IF_ERROR(Accumulate(in.g.grad, back.dg, true));
      if (back.dgk.defined()) LAIR_RETURN_IF_ERROR(Accumulate(in.gk.grad, back.dgk, true));
      return absl::OkStatus();
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Gsa(const kernels::SequenceBatch& batch, const GsaInputs& in,
                               const Tensor& state_k, const Tensor& state_v,
                               kernels::MixerForm form) {
  kernels::GsaForwardArgs args;
  args.heads = static_cast<int>(in.q.dim(1));
  args.key_dim = static_cast<int>(in.q.dim(2));
  args.value_dim = static_cast<int>(in.v.dim(2));
  args.num_slots_m = static_cast<int>(in.s.dim(2));
  args.scale = in.scale;
  args.q = in.q.t;
  args.k = in.k.t;
  args.v = in.v.t;
  args.s = in.s.t;
  args.g = in.g.t;
  args.state_k = state_k;
  args.state_v = state_v;
  LAIR_ASSIGN_OR_RETURN(args.o, New(in.v.shape()));
  LAIR_RETURN_IF_ERROR(backend_->GsaForward(batch, args, form));
  Var out{args.o, NewGrad({&in.q, &in.k, &in.v, &in.s, &in.g})};
  if (out.grad >= 0) {
    LAIR_RETURN_IF_ERROR(RequireTrainable(batch, "Gsa"));
    Record([this, batch, args, in, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, in.v.shape());
      kernels::GsaBackwardArgs back;
      back.fwd = args;
      back.d_o = dy;
      LAIR_ASSIGN_OR_RETURN(back.dq, New(in.q.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dk, New(in.k.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dv, New(in.v.shape()));
      LAIR_ASSIGN_OR_RETURN(back.ds, New(in.s.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dg, New(in.g.shape()));
      LAIR_RETURN_IF_ERROR(backend_->GsaBackward(batch, back));
      LAIR_RETURN_IF_ERROR(Accumulate(in.q.grad, back.dq, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.k.grad, back.dk, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.v.grad, back.dv, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.s.grad, back.ds, true));
      return Accumulate(in.g.grad, back.dg, true);
    });
  }
  return out;
}

absl::StatusOr<Var> Graph::Mlstm(const kernels::SequenceBatch& batch, const MlstmInputs& in,
                                 const Tensor& state_c, const Tensor& state_n,
                                 const Tensor& state_m, kernels::MixerForm form) {
  kernels::MlstmForwardArgs args;
  args.kind = in.kind;
  args.heads = static_cast<int>(in.q.dim(1));
  args.key_dim = static_cast<int>(in.q.dim(2));
  args.value_dim = static_cast<int>(in.v.dim(2));
  args.eps = in.eps;
  args.q = in.q.t;
  args.k = in.k.t;
  args.v = in.v.t;
  args.i = in.i.t;
  args.f = in.f.t;
  args.state_c = state_c;
  args.state_n = state_n;
  args.state_m = state_m;
  LAIR_ASSIGN_OR_RETURN(args.h, New(in.v.shape()));
  if (record_ && args.kind != kernels::MlstmKind::kSig) {
    // Kept for the backward, which then does not run the forward again.
    LAIR_ASSIGN_OR_RETURN(args.norm_dot, New({in.q.dim(0), args.heads}));
  }
  LAIR_RETURN_IF_ERROR(backend_->MlstmForward(batch, args, form));
  Var out{args.h, NewGrad({&in.q, &in.k, &in.v, &in.i, &in.f})};
  if (out.grad >= 0) {
    LAIR_RETURN_IF_ERROR(RequireTrainable(batch, "Mlstm"));
    Record([this, batch, args, in, id = out.grad]() -> absl::Status {
      LAIR_GRAD_OR_SKIP(dy, id, in.v.shape());
      kernels::MlstmBackwardArgs back;
      back.fwd = args;
      back.d_h = dy;
      LAIR_ASSIGN_OR_RETURN(back.dq, New(in.q.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dk, New(in.k.shape()));
      LAIR_ASSIGN_OR_RETURN(back.dv, New(in.v.shape()));
      LAIR_ASSIGN_OR_RETURN(back.di, New(in.i.shape()));
      LAIR_ASSIGN_OR_RETURN(back.df, New(in.f.shape()));
      LAIR_RETURN_IF_ERROR(backend_->MlstmBackward(batch, back));
      LAIR_RETURN_IF_ERROR(Accumulate(in.q.grad, back.dq, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.k.grad, back.dk, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.v.grad, back.dv, true));
      LAIR_RETURN_IF_ERROR(Accumulate(in.i.grad, back.di, true));
      return Accumulate(in.f.grad, back.df, true);
    });
  }
  return out;
}

absl::StatusOr<double> Graph::CrossEntropy(const Var& logits, const Tensor& targets,
                                           float grad_scale) {
  kernels::CrossEntropyArgs args;
  args.logits = As2d(logits.t);
  args.targets = targets;
  args.grad_scale = grad_scale;
  LAIR_ASSIGN_OR_RETURN(args.losses, New({args.logits.dim(0)}));
  if (record_ && logits.grad >= 0) {
    LAIR_ASSIGN_OR_RETURN(args.d_logits, New(args.logits.shape()));
  }
  LAIR_RETURN_IF_ERROR(backend_->CrossEntropy(args));
  if (args.d_logits.defined()) LAIR_RETURN_IF_ERROR(Accumulate(logits.grad, args.d_logits, true));
  LAIR_ASSIGN_OR_RETURN(Tensor losses, backend_->Download(args.losses));
  double sum = 0;
  for (int64_t i = 0; i < losses.numel(); ++i) sum += losses.f32()[i];
  return sum;
}

#undef LAIR_GRAD_OR_SKIP

}  // namespace lair::models
