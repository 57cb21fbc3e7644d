#include "models/verify.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "models/model.h"
#include "models/state_pool.h"

namespace lair::models {
namespace {

absl::StatusOr<std::vector<int32_t>> ReadIds(const SafetensorsFile& file, std::string_view name) {
  LAIR_ASSIGN_OR_RETURN(Tensor t, file.Get(name));
  if (t.dtype() != DType::kI64 && t.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", std::string(name), " is not an integer tensor"));
  }
  std::vector<int32_t> ids(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    ids[i] = static_cast<int32_t>(t.dtype() == DType::kI64 ? t.data<int64_t>()[i]
                                                           : t.data<int32_t>()[i]);
  }
  return ids;
}

int32_t ArgMax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Step `golden` of a greedy run decided by the rows ours[0..vocab) and
// ref[0..vocab): the golden margin and the largest logit error there.
GreedyStep MakeStep(const float* ours, const float* ref, int64_t vocab, int32_t golden) {
  GreedyStep step;
  step.ours = ArgMax(ours, vocab);
  step.golden = golden;
  float runner_up = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < vocab; ++j) {
    if (j != golden) runner_up = std::max(runner_up, ref[j]);
    step.logit_error = std::max(step.logit_error, std::fabs(static_cast<double>(ours[j]) - ref[j]));
  }
  step.golden_margin = static_cast<double>(ref[golden]) - runner_up;
  return step;
}

// Host F32 [rows, V] from a list of [1, V] rows.
Tensor Stack(const std::vector<Tensor>& rows) {
  int64_t vocab = rows.empty() ? 0 : rows[0].numel();
  Tensor out = Tensor::Zeros(DType::kF32, {static_cast<int64_t>(rows.size()), vocab});
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].f32(), rows[i].f32() + vocab, out.f32() + i * vocab);
  }
  return out;
}

class Verifier {
 public:
  Verifier(Model* model, StatePool* pool) : model_(model), pool_(pool) {}

  // Logits of every position of `prompt` fed as one prefill into `slot`.
  absl::StatusOr<Tensor> Prefill(const std::vector<int32_t>& prompt, int slot) {
    LAIR_RETURN_IF_ERROR(pool_->Zero(slot));
    ForwardBatch batch;
    batch.tokens = prompt;
    batch.cu_seqlens = {0, static_cast<int32_t>(prompt.size())};
    batch.slots = {slot};
    batch.start_positions = {0};
    batch.all_logits = true;
    return model_->Forward(batch, *pool_);
  }

  // Logits [1, V] after appending `token` at `position` of `slot`.
  absl::StatusOr<Tensor> Step(int32_t token, int position, int slot) {
    ForwardBatch batch;
    batch.tokens = {token};
    batch.cu_seqlens = {0, 1};
    batch.slots = {slot};
    batch.start_positions = {position};
    return model_->Forward(batch, *pool_);
  }

  absl::StatusOr<Tensor> Stepwise(const std::vector<int32_t>& prompt, int slot) {
    LAIR_RETURN_IF_ERROR(pool_->Zero(slot));
    std::vector<Tensor> rows;
    for (size_t i = 0; i < prompt.size(); ++i) {
      LAIR_ASSIGN_OR_RETURN(Tensor row, Step(prompt[i], static_cast<int>(i), slot));
      rows.push_back(std::move(row));
    }
    return Stack(rows);
  }

 private:
  Model* model_;
  StatePool* pool_;
};

absl::Status Compare(ModelReport* report, const std::string& label, const Tensor& ours,
                     const Tensor& ref, double tolerance) {
  if (ours.numel() != ref.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": got ", ours.DebugString(), ", golden ", ref.DebugString()));
  }
  Tensor ref32 = ref.ToF32();
  report->checks.push_back({label, RelativeError(ours.ToF32(), ref32), tolerance});
  return absl::OkStatus();
}

// The goldens a model's forward is checked against.
struct Goldens {
  std::shared_ptr<const SafetensorsFile> file;
  std::vector<int32_t> prompt_a, prompt_b, greedy;
};

absl::StatusOr<Goldens> ReadGoldens(const std::string& dir) {
  Goldens g;
  LAIR_ASSIGN_OR_RETURN(g.file, SafetensorsFile::Open(dir + "/golden.safetensors"));
  LAIR_ASSIGN_OR_RETURN(g.prompt_a, ReadIds(*g.file, "prompt_a"));
  LAIR_ASSIGN_OR_RETURN(g.prompt_b, ReadIds(*g.file, "prompt_b"));
  LAIR_ASSIGN_OR_RETURN(g.greedy, ReadIds(*g.file, "greedy_a"));
  return g;
}

// Loaded as `lair serve` loads it, norms' weights folded into the products
// and low-rank gates fused, unless `for_training` (LossAndGrad).
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, const Goldens& golden,
                                                 kernels::Backend* backend, DType weight_dtype,
                                                 bool for_training = false) {
  LoadOptions load;
  load.weight_dtype = weight_dtype;
  load.fold_norm_weights = !for_training;
  load.fuse_low_rank_gates = !for_training;
  load.max_context = static_cast<int>(
      std::max(golden.prompt_a.size() + golden.greedy.size(), golden.prompt_b.size()));
  return Model::Load(dir, backend, load);
}

// The forward's checks: both prompts' logits, prefilled and stepped, then
// the greedy continuation of prompt_a (its tokens and logits).
absl::Status AddLogitsChecks(const Goldens& golden, Model& model, StatePool& pool, bool bf16,
                             double logits_tol, std::vector<ModelCheck>* checks) {
  ModelReport report;
  Verifier v(&model, &pool);
  for (const auto& [name, prompt] :
       {std::pair<std::string, const std::vector<int32_t>*>{"a", &golden.prompt_a},
        {"b", &golden.prompt_b}}) {
    LAIR_ASSIGN_OR_RETURN(Tensor ref, golden.file->Get("logits_" + name));
    LAIR_ASSIGN_OR_RETURN(Tensor prefill, v.Prefill(*prompt, 1));
    LAIR_RETURN_IF_ERROR(Compare(&report, "prefill logits_" + name, prefill, ref, logits_tol));
    LAIR_ASSIGN_OR_RETURN(Tensor stepwise, v.Stepwise(*prompt, 1));
    LAIR_RETURN_IF_ERROR(Compare(&report, "step logits_" + name, stepwise, ref, logits_tol));
  }

  // Greedy continuation of prompt_a from its prefilled state. Step i is
  // decided by prompt_a's last row (i = 0), then by the row after golden
  // token i - 1: the golden token is fed so one early difference does not
  // derail the rest.
  const std::vector<int32_t>& prompt_a = golden.prompt_a;
  LAIR_ASSIGN_OR_RETURN(Tensor greedy_logits_ref, golden.file->Get("greedy_logits_a"));
  LAIR_ASSIGN_OR_RETURN(Tensor logits_a_ref, golden.file->Get("logits_a"));
  Tensor ref_a = logits_a_ref.ToF32(), ref_greedy = greedy_logits_ref.ToF32();
  LAIR_ASSIGN_OR_RETURN(Tensor prefill, v.Prefill(prompt_a, 0));
  const int64_t vocab = prefill.dim(1);
  if (ref_a.numel() != prefill.numel() ||
      ref_greedy.numel() != static_cast<int64_t>(golden.greedy.size()) * vocab) {
    return absl::InvalidArgumentError(absl::StrCat("greedy: golden logits_a ", ref_a.DebugString(),
                                                   " or greedy_logits_a ", ref_greedy.DebugString(),
                                                   " do not match vocab ", vocab));
  }
  const float* ours_row = prefill.f32() + (prefill.dim(0) - 1) * vocab;
  const float* ref_row = ref_a.f32() + (prefill.dim(0) - 1) * vocab;
  std::vector<GreedyStep> steps;
  std::vector<Tensor> greedy_logits;
  for (size_t i = 0; i < golden.greedy.size(); ++i) {
    steps.push_back(MakeStep(ours_row, ref_row, vocab, golden.greedy[i]));
    LAIR_ASSIGN_OR_RETURN(Tensor row,
                          v.Step(golden.greedy[i], static_cast<int>(prompt_a.size() + i), 0));
    greedy_logits.push_back(std::move(row));
    ours_row = greedy_logits.back().f32();
    ref_row = ref_greedy.f32() + i * vocab;
  }
  report.checks.push_back(GreedyTokensCheck(steps, bf16));
  LAIR_RETURN_IF_ERROR(
      Compare(&report, "greedy logits", Stack(greedy_logits), greedy_logits_ref, logits_tol));
  checks->insert(checks->end(), report.checks.begin(), report.checks.end());
  return absl::OkStatus();
}

// With bf16 weights, rounding the checkpoint's matrices alone moves the
// logits from the fp32 goldens, by up to more than the bf16 tolerance for
// an ill-conditioned model (linear_attn-tiny's unnormalized state: 1.2e-1 on
// prompt_b with the norms' weights kept, 1.3e-2 with them folded into the
// matrices before rounding). That distance, measured by the fp32 CPU
// reference on the same rounded (and folded) matrices, is added to each
// logits tolerance: the check then bounds what the device's own arithmetic
// adds.
absl::Status AddWeightRounding(const std::string& dir, const Goldens& golden, DType weight_dtype,
                               double logits_tol, std::vector<ModelCheck>* checks) {
  std::unique_ptr<kernels::Backend> cpu = kernels::MakeCpuBackend();
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        LoadModel(dir, golden, cpu.get(), weight_dtype));
  LAIR_ASSIGN_OR_RETURN(StatePool pool, StatePool::Create(cpu.get(), model->state_layout(), 2));
  std::vector<ModelCheck> rounded;
  LAIR_RETURN_IF_ERROR(AddLogitsChecks(golden, *model, pool, true, logits_tol, &rounded));
  // Both lists come from AddLogitsChecks, check for check in the same order.
  if (rounded.size() != checks->size()) {
    return absl::InternalError("the weight-rounding reference made other checks");
  }
  for (size_t i = 0; i < rounded.size(); ++i) {
    ModelCheck& check = (*checks)[i];
    if (check.label.starts_with("greedy tokens")) continue;  // judged by its margins
    check.tolerance += rounded[i].relative_error;
    absl::StrAppend(&check.label,
                    absl::StrFormat(" (tolerance %.0e + %.1e, the fp32 reference on the same "
                                    "bf16 weights)",
                                    logits_tol, rounded[i].relative_error));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& dir, kernels::Backend* backend,
                 const VerifyModelOptions& options, ModelReport* report) {
  const bool bf16 = options.weight_dtype != DType::kF32;
  const double logits_tol = bf16 ? 2e-2 : 1e-4;
  double grad_tol = bf16 ? 5e-2 : 1e-3;
  LAIR_ASSIGN_OR_RETURN(Goldens golden, ReadGoldens(dir));
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        LoadModel(dir, golden, backend, options.weight_dtype));
  // The linear_attn goldens' gradients are 1.0-1.5e-3 (relative L2) from a
  // float64 evaluation of the same model, in layer 1's q/k feature-map path
  // and upstream; ours are within 4.7e-5 of float64 there (a plain torch
  // fp32 CPU run: 5.4e-4), and their loss and logits agree with float64 to
  // 4e-8 and 2e-6. The unnormalized state makes these gradients
  // ill-conditioned, so the reference kernels' fp32 noise shows; ours land
  // at up to 1.55e-3 from the goldens, hence 2e-3 for this family.
  if (!bf16 && model->family() == "linear_attn") grad_tol = 2e-3;
  LAIR_ASSIGN_OR_RETURN(StatePool pool, StatePool::Create(backend, model->state_layout(), 2));
  std::vector<ModelCheck> logits;
  LAIR_RETURN_IF_ERROR(AddLogitsChecks(golden, *model, pool, bf16, logits_tol, &logits));
  if (bf16) {
    LAIR_RETURN_IF_ERROR(AddWeightRounding(dir, golden, options.weight_dtype, logits_tol, &logits));
  }
  report->checks.insert(report->checks.end(), logits.begin(), logits.end());

  const std::string grads_path = dir + "/grads.safetensors";
  if (!options.gradients || !std::filesystem::exists(grads_path)) return absl::OkStatus();
  LAIR_ASSIGN_OR_RETURN(auto grads, SafetensorsFile::Open(grads_path));
  model.reset();
  LAIR_ASSIGN_OR_RETURN(model, LoadModel(dir, golden, backend, options.weight_dtype,
                                         /*for_training=*/true));
  LAIR_ASSIGN_OR_RETURN(LossAndGradients ours, model->LossAndGrad(golden.prompt_b));
  LAIR_ASSIGN_OR_RETURN(Tensor loss_ref, grads->Get("loss"));
  LAIR_RETURN_IF_ERROR(Compare(report, "loss",
                               Tensor::FromFloats({1}, {static_cast<float>(ours.loss)}), loss_ref,
                               logits_tol));
  for (const auto& [name, grad] : ours.gradients) {
    absl::StatusOr<Tensor> ref = grads->Get(name);
    if (!ref.ok()) {
      report->checks.push_back(
          {"grad " + name + " (absent from grads.safetensors)", 1.0, grad_tol});
      continue;
    }
    LAIR_RETURN_IF_ERROR(Compare(report, "grad " + name, grad, *ref, grad_tol));
  }
  return absl::OkStatus();
}

}  // namespace

ModelCheck GreedyTokensCheck(std::span<const GreedyStep> steps, bool bf16) {
  int failing = 0;
  std::vector<std::string> differing;
  for (size_t i = 0; i < steps.size(); ++i) {
    const GreedyStep& step = steps[i];
    if (step.ours == step.golden) continue;
    const bool within_error = bf16 && step.golden_margin < step.logit_error;
    if (!within_error) ++failing;
    differing.push_back(absl::StrFormat(
        "step %d: %d vs golden %d, margin %.1e %s error %.1e", i, step.ours, step.golden,
        step.golden_margin, step.golden_margin < step.logit_error ? "<" : ">=", step.logit_error));
  }
  ModelCheck check{"greedy tokens", 0.0, 0.0};
  if (!differing.empty()) {
    absl::StrAppend(&check.label, " (", absl::StrJoin(differing, "; "), ")");
    check.relative_error = static_cast<double>(failing) / steps.size();
  }
  return check;
}

bool ModelReport::passed() const {
  if (!status.ok() || checks.empty()) return false;
  return std::all_of(checks.begin(), checks.end(), [](const ModelCheck& c) { return c.passed(); });
}

ModelReport VerifyModel(const std::string& dir, kernels::Backend* backend,
                        const VerifyModelOptions& options) {
  ModelReport report;
  report.status = Run(dir, backend, options, &report);
  return report;
}

}  // namespace lair::models
