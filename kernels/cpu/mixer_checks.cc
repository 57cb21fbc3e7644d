#include "kernels/cpu/mixer_checks.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lair::kernels::cpu {
namespace {

absl::Status Invalid(std::string_view name, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": ", std::string(what)));
}

}  // namespace

absl::Status CheckSequenceBatch(const SequenceBatch& batch, int64_t num_tokens, int64_t num_slots,
                                bool distinct_slots) {
  if (batch.num_seqs < 0)
    return Invalid("num_seqs", absl::StrCat("negative (", batch.num_seqs, ")"));
  const size_t seqs = static_cast<size_t>(batch.num_seqs);
  if (batch.cu_seqlens.size() != seqs + 1) {
    return Invalid("cu_seqlens", absl::StrCat("has ", batch.cu_seqlens.size(),
                                              " entries, expected num_seqs + 1 = ", seqs + 1));
  }
  if (batch.cu_seqlens[0] != 0)
    return Invalid("cu_seqlens", absl::StrCat("starts at ", batch.cu_seqlens[0], ", not 0"));
  for (size_t s = 0; s < seqs; ++s) {
    if (batch.cu_seqlens[s + 1] < batch.cu_seqlens[s]) {
      return Invalid("cu_seqlens",
                     absl::StrCat("decreases at sequence ", s, " (", batch.cu_seqlens[s], " > ",
                                  batch.cu_seqlens[s + 1], ")"));
    }
  }
  if (batch.cu_seqlens[seqs] != num_tokens) {
    return Invalid("cu_seqlens", absl::StrCat("ends at ", batch.cu_seqlens[seqs],
                                              " but the tensors hold ", num_tokens, " tokens"));
  }
  if (batch.state_slot.size() != seqs) {
    return Invalid("state_slot", absl::StrCat("has ", batch.state_slot.size(),
                                              " entries, expected num_seqs = ", seqs));
  }
  std::vector<int> user(static_cast<size_t>(num_slots), -1);
  for (size_t s = 0; s < seqs; ++s) {
    const int32_t slot = batch.state_slot[s];
    if (slot < 0 || slot >= num_slots) {
      return Invalid("state_slot", absl::StrCat("sequence ", s, " uses slot ", slot,
                                                ", outside [0, ", num_slots, ")"));
    }
    if (distinct_slots && user[slot] >= 0) {
      return Invalid("state_slot",
                     absl::StrCat("slot ", slot, " is used by sequences ", user[slot], " and ", s));
    }
    user[slot] = static_cast<int>(s);
  }
  return absl::OkStatus();
}

absl::Status CheckTensor(const Tensor& t, std::string_view name, const Shape& shape,
                         Floats floats) {
  LAIR_RETURN_IF_ERROR(ExpectShape(t, shape, name));
  if (t.device() != Device::kCpu) return Invalid(name, "not in host memory");
  const DType d = t.dtype();
  const bool ok = d == DType::kF32 || (floats == Floats::kAny && IsSixteenBitFloat(d));
  if (!ok) {
    return Invalid(
        name, absl::StrCat("dtype ", std::string(DTypeName(d)), " not supported here (expected ",
                           floats == Floats::kF32 ? "F32" : "F32, BF16 or F16", ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptionalTensor(const Tensor& t, std::string_view name, const Shape& shape,
                                 Floats floats) {
  if (!t.defined()) return absl::OkStatus();
  return CheckTensor(t, name, shape, floats);
}

absl::Status CheckRank(const Tensor& t, std::string_view name, int rank) {
  if (!t.defined()) return Invalid(name, "missing tensor");
  if (t.device() != Device::kCpu) return Invalid(name, "not in host memory");
  if (t.rank() != rank) {
    return Invalid(name,
                   absl::StrCat("expected rank ", rank, ", got shape ", ShapeString(t.shape())));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(int64_t value, std::string_view name) {
  if (value < 1) return Invalid(name, absl::StrCat("must be at least 1, got ", value));
  return absl::OkStatus();
}

}  // namespace lair::kernels::cpu
