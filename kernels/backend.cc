// The host defaults of Backend's step methods, LinearGroup and the option parsers.
#include "kernels/backend.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dense_checks.h"

namespace lair::kernels {

absl::StatusOr<GemmMode> ParseGemmMode(std::string_view name, std::string_view flag) {
  if (name == "exact") return GemmMode::kExact;
  if (name == "fast") return GemmMode::kFast;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(flag), " must be fast or exact, not '", std::string(name), "'"));
}

absl::StatusOr<ScanSchedule> ParseScanSchedule(std::string_view name, std::string_view flag) {
  if (name == "auto") return ScanSchedule::kAuto;
  if (name == "one-pass") return ScanSchedule::kOnePass;
  if (name == "two-pass") return ScanSchedule::kTwoPass;
  if (name == "segmented") return ScanSchedule::kSegmented;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(flag), " must be auto, one-pass, two-pass or segmented, not '",
                   std::string(name), "'"));
}

absl::StatusOr<std::vector<Tensor>> Backend::StageInts(
    std::span<const std::span<const int32_t>> parts) {
  std::vector<Tensor> out;
  for (std::span<const int32_t> part : parts) {
    Tensor host = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(part.size())});
    std::copy(part.begin(), part.end(), host.data<int32_t>());
    LAIR_ASSIGN_OR_RETURN(Tensor device, Upload(host, DType::kI32));
    out.push_back(std::move(device));
  }
  return out;
}

namespace {

// ArgmaxRows' and SampleRows' operands: logits F32 [R, V], ids I32 [R].
absl::Status CheckRowsAndIds(const char* op, const Tensor& logits, const Tensor& ids) {
  if (logits.rank() != 2 || logits.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": logits must be F32 [R, V], got ", logits.DebugString()));
  }
  if (ids.dtype() != DType::kI32)
    return absl::InvalidArgumentError(absl::StrCat(op, ": ids must be I32"));
  return ExpectShape(ids, {logits.dim(0)}, "ids");
}

}  // namespace

absl::Status Backend::ArgmaxRows(const Tensor& logits, const Tensor& ids) {
  if (device() != Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat(Name(), " has no ArgmaxRows"));
  }
  LAIR_RETURN_IF_ERROR(CheckRowsAndIds("ArgmaxRows", logits, ids));
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.f32() + r * vocab;
    ids.data<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
  return absl::OkStatus();
}

absl::Status CheckDrawLogprobs(std::span<const RowSampling> rows, const DrawLogprobs& out,
                               Device device) {
  bool asked = false;
  for (const RowSampling& r : rows) {
    if (r.logprobs > kMaxRowLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("SampleRows: logprobs ", r.logprobs, " is more than ", kMaxRowLogprobs));
    }
    asked |= r.logprobs >= 0;
  }
  if (!asked) return absl::OkStatus();
  const auto rows_n = static_cast<int64_t>(rows.size());
  if (!out.values.defined() || out.values.device() != device || out.values.dtype() != DType::kF32) {
    return absl::InvalidArgumentError("SampleRows: logprobs.values must be F32 on the device");
  }
  if (!out.top_ids.defined() || out.top_ids.device() != device ||
      out.top_ids.dtype() != DType::kI32) {
    return absl::InvalidArgumentError("SampleRows: logprobs.top_ids must be I32 on the device");
  }
  LAIR_RETURN_IF_ERROR(ExpectShape(out.values, {rows_n, 1 + kMaxRowLogprobs}, "logprobs.values"));
  return ExpectShape(out.top_ids, {rows_n, kMaxRowLogprobs}, "logprobs.top_ids");
}

absl::Status Backend::SampleRows(const Tensor& logits, std::span<const RowSampling> rows,
                                 const Tensor& ids, const DrawLogprobs& logprobs) {
  if (device() != Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat(Name(), " has no SampleRows"));
  }
  LAIR_RETURN_IF_ERROR(CheckRowsAndIds("SampleRows", logits, ids));
  if (static_cast<int64_t>(rows.size()) != logits.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleRows: ", rows.size(), " sampling rows for ", logits.dim(0), " logits rows"));
  }
  LAIR_RETURN_IF_ERROR(CheckDrawLogprobs(rows, logprobs, Device::kCpu));
  const int64_t vocab = logits.dim(1);
  std::vector<float> distribution;
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const std::span<const float> row(logits.f32() + r * vocab, vocab);
    const RowSampling& rule = rows[r];
    if (rule.logprobs < 0) {
      ids.data<int32_t>()[r] = SampleRow(row, rule);
      continue;
    }
    distribution.resize(static_cast<size_t>(vocab));
    const int32_t token = SampleRow(row, rule, distribution);
    ids.data<int32_t>()[r] = token;
    float* values = logprobs.values.f32() + r * (1 + kMaxRowLogprobs);
    int32_t* top_ids = logprobs.top_ids.data<int32_t>() + r * kMaxRowLogprobs;
    values[0] = distribution[static_cast<size_t>(token)];
    std::fill(values + 1, values + 1 + kMaxRowLogprobs, -std::numeric_limits<float>::infinity());
    std::fill(top_ids, top_ids + kMaxRowLogprobs, -1);
    const std::vector<std::pair<int32_t, float>> top = TopLogprobs(distribution, rule.logprobs);
    for (size_t i = 0; i < top.size(); ++i) {
      top_ids[i] = top[i].first;
      values[1 + i] = top[i].second;
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::LinearGroup(const LinearGroupArgs& args) {
  LAIR_ASSIGN_OR_RETURN(std::vector<LinearProduct> products, LinearGroupProducts(args, device()));
  // The input the products read, when not x itself.
  Tensor formed;
  if (args.silu_gate.defined() || args.input_norm) {
    LAIR_ASSIGN_OR_RETURN(formed, AllocateScratch(DType::kF32, args.x.shape()));
  }
  if (args.silu_gate.defined()) {
    LAIR_RETURN_IF_ERROR(Binary({BinaryOp::kSiluMul, args.silu_gate, args.x, formed}));
  } else if (args.input_norm) {
    NormArgs norm = *args.input_norm;
    norm.x = args.x;
    norm.y = formed;
    LAIR_RETURN_IF_ERROR(Norm(norm));
  }
  for (LinearProduct& product : products) {
    GemmArgs& gemm = product.gemm;
    if (formed.defined()) gemm.a = formed;
    const Activation& act = product.activation;
    // Without an activation the residual is the product's c (beta = 1).
    const bool residual_in_product = product.residual.defined() && act.identity();
    if (residual_in_product) {
      if (product.residual.raw() != gemm.c.raw()) {
        LAIR_RETURN_IF_ERROR(Copy(product.residual, gemm.c));
      }
      gemm.beta = 1.0f;
    }
    LAIR_RETURN_IF_ERROR(Gemm(gemm));
    if (!act.identity()) {
      LAIR_RETURN_IF_ERROR(Unary({act.op, act.alpha, act.beta, act.in_scale, gemm.c, gemm.c}));
    }
    if (product.residual.defined() && !residual_in_product) {
      LAIR_RETURN_IF_ERROR(Binary({BinaryOp::kAdd, gemm.c, product.residual, gemm.c}));
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::SwiGlu(const SwiGluArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckSwiGluArgs(args, device()).status());
  const Shape hidden = {args.x.dim(0), args.w_gate.dim(0)};
  LAIR_ASSIGN_OR_RETURN(Tensor gate, AllocateScratch(DType::kF32, hidden));
  LAIR_ASSIGN_OR_RETURN(Tensor up, AllocateScratch(DType::kF32, hidden));
  const Tensor gate_up[] = {args.w_gate, args.w_up}, projections[] = {gate, up};
  LinearGroupArgs first{args.x, gate_up, {}, projections};
  first.input_norm = args.input_norm;
  LAIR_RETURN_IF_ERROR(LinearGroup(first));
  const Tensor residuals[] = {args.residual};
  LinearGroupArgs down{up, {&args.w_down, 1}, {}, {&args.out, 1}, {}, residuals};
  down.silu_gate = gate;
  return LinearGroup(down);
}

absl::StatusOr<std::unique_ptr<StepGraph>> Backend::CaptureStep(
    const std::function<absl::Status()>& /*step*/) {
  return absl::UnimplementedError(absl::StrCat(Name(), " does not record steps"));
}

absl::StatusOr<std::unique_ptr<PersistentDecode>> Backend::MakePersistentDecode(
    const PersistentDecodeModel& /*model*/) {
  return absl::UnimplementedError(absl::StrCat(Name(), " has no persistent decode kernel"));
}

}  // namespace lair::kernels
