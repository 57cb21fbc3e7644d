#include "kernels/cpu/cpu_backend.h"

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/decay.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/gsa.h"
#include "kernels/cpu/mlstm.h"
#include "kernels/cpu/parallel.h"

namespace lair::kernels::cpu {
namespace {

absl::Status CheckHost(const Tensor& t, std::string_view name) {
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": missing tensor"));
  if (t.device() != Device::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": not in host memory"));
  }
  return absl::OkStatus();
}

}  // namespace

CpuBackend::CpuBackend(int threads) : threads_(ResolveThreads(threads)) {}

std::string CpuBackend::Name() const { return absl::StrCat("cpu (", threads_, " threads)"); }

absl::StatusOr<Tensor> CpuBackend::Allocate(DType dtype, Shape shape) {
  for (int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("shape: negative size in ", ShapeString(shape)));
  }
  return Tensor::Zeros(dtype, std::move(shape));
}

absl::StatusOr<Tensor> CpuBackend::Upload(const Tensor& host, DType dtype) {
  LAIR_RETURN_IF_ERROR(CheckHost(host, "host"));
  if (host.dtype() == dtype) return host.Clone();
  if (!IsFloat(host.dtype()) || !IsFloat(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("dtype: cannot convert ",
                                                   std::string(DTypeName(host.dtype())), " to ",
                                                   std::string(DTypeName(dtype))));
  }
  Tensor f32 = host.ToF32();
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::Zeros(dtype, host.shape());
  const float* src = f32.f32();
  uint16_t* dst = out.data<uint16_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    dst[i] = dtype == DType::kBF16 ? FloatToBF16(src[i]) : FloatToF16(src[i]);
  }
  return out;
}

absl::StatusOr<Tensor> CpuBackend::Download(const Tensor& device_tensor) {
  LAIR_RETURN_IF_ERROR(CheckHost(device_tensor, "device_tensor"));
  return device_tensor.Clone();
}

absl::Status CpuBackend::Copy(const Tensor& src, const Tensor& dst) {
  LAIR_RETURN_IF_ERROR(CheckHost(src, "src"));
  LAIR_RETURN_IF_ERROR(CheckHost(dst, "dst"));
  if (src.dtype() != dst.dtype() || src.numel() != dst.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dst: ", dst.DebugString(), " cannot receive ", src.DebugString()));
  }
  std::memmove(dst.raw(), src.raw(), src.nbytes());
  return absl::OkStatus();
}

absl::Status CpuBackend::Synchronize() { return absl::OkStatus(); }

// --- Mixers -----------------------------------------------------------------

absl::Status CpuBackend::DecayForward(const SequenceBatch& batch, const DecayForwardArgs& args,
                                      MixerForm form) {
  return DecayForwardCpu(batch, args, form, threads_);
}

absl::Status CpuBackend::DecayBackward(const SequenceBatch& batch, const DecayBackwardArgs& args) {
  return DecayBackwardCpu(batch, args, MixerForm::kAuto, threads_);
}

absl::Status CpuBackend::GsaForward(const SequenceBatch& batch, const GsaForwardArgs& args,
                                    MixerForm form) {
  return GsaForwardCpu(batch, args, form, threads_);
}

absl::Status CpuBackend::GsaBackward(const SequenceBatch& batch, const GsaBackwardArgs& args) {
  return GsaBackwardCpu(batch, args, threads_);
}

absl::Status CpuBackend::MlstmForward(const SequenceBatch& batch, const MlstmForwardArgs& args,
                                      MixerForm form) {
  return MlstmForwardCpu(batch, args, form, threads_);
}

absl::Status CpuBackend::MlstmBackward(const SequenceBatch& batch, const MlstmBackwardArgs& args) {
  return MlstmBackwardCpu(batch, args, threads_);
}

// --- Dense operations ---------------------------------------------------------

absl::Status CpuBackend::Gemm(const GemmArgs& args) { return GemmCpu(args); }
absl::Status CpuBackend::Embedding(const EmbeddingArgs& args) { return EmbeddingCpu(args); }
absl::Status CpuBackend::EmbeddingBackward(const EmbeddingBackwardArgs& args) {
  return EmbeddingBackwardCpu(args);
}
absl::Status CpuBackend::Norm(const NormArgs& args) { return NormCpu(args); }
absl::Status CpuBackend::NormBackward(const NormBackwardArgs& args) {
  return NormBackwardCpu(args);
}
absl::Status CpuBackend::Unary(const UnaryArgs& args) { return UnaryCpu(args); }
absl::Status CpuBackend::UnaryBackward(const UnaryBackwardArgs& args) {
  return UnaryBackwardCpu(args);
}
absl::Status CpuBackend::Binary(const BinaryArgs& args) { return BinaryCpu(args); }
absl::Status CpuBackend::ReduceSum(const ReduceSumArgs& args) { return ReduceSumCpu(args); }
absl::Status CpuBackend::CopyColumns(const CopyColumnsArgs& args) { return CopyColumnsCpu(args); }
absl::Status CpuBackend::Conv1d(const SequenceBatch& batch, const Conv1dArgs& args) {
  return Conv1dCpu(batch, args);
}
absl::Status CpuBackend::Conv1dBackward(const SequenceBatch& batch,
                                        const Conv1dBackwardArgs& args) {
  return Conv1dBackwardCpu(batch, args);
}
absl::Status CpuBackend::Rotary(const RotaryArgs& args) { return RotaryCpu(args); }
absl::Status CpuBackend::Attention(const SequenceBatch& batch, const AttentionArgs& args) {
  return AttentionCpu(batch, args);
}
absl::Status CpuBackend::AttentionBackward(const SequenceBatch& batch,
                                           const AttentionBackwardArgs& args) {
  return AttentionBackwardCpu(batch, args);
}
absl::Status CpuBackend::CrossEntropy(const CrossEntropyArgs& args) {
  return CrossEntropyCpu(args);
}

}  // namespace lair::kernels::cpu

namespace lair::kernels {

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

}  // namespace lair::kernels
