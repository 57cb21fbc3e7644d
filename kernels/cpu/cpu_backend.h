// CpuBackend: kernels::Backend on the host, the fp32 reference.
//
// Memory is ordinary host memory (64-byte aligned, from Tensor::Zeros); every
// operation runs to completion before it returns, so Synchronize has nothing
// to wait for. The class only validates device placement and dispatches: the
// mixers live in kernels/cpu/decay.h, gsa.h and mlstm.h, the dense operations
// in kernels/cpu/dense.h, each validating its own arguments.
//
// Thread safety: as for every Backend, one thread at a time; operations use
// up to `threads` worker threads internally.
#pragma once

#include <string>

#include "kernels/backend.h"

namespace lair::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  // `threads` <= 0 uses every core.
  explicit CpuBackend(int threads);

  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  Device device() const override { return Device::kCpu; }
  // "cpu (N threads)"
  std::string Name() const override;

  absl::StatusOr<Tensor> Allocate(DType dtype, Shape shape) override;
  // Float dtypes convert between F32, BF16 and F16 (rounding to nearest
  // even); integer tensors upload only to their own dtype.
  absl::StatusOr<Tensor> Upload(const Tensor& host, DType dtype) override;
  absl::StatusOr<Tensor> Download(const Tensor& device_tensor) override;
  absl::Status Copy(const Tensor& src, const Tensor& dst) override;
  absl::Status Synchronize() override;

  absl::Status DecayForward(const SequenceBatch& batch, const DecayForwardArgs& args,
                            MixerForm form) override;
  absl::Status DecayBackward(const SequenceBatch& batch, const DecayBackwardArgs& args) override;
  absl::Status GsaForward(const SequenceBatch& batch, const GsaForwardArgs& args,
                          MixerForm form) override;
  absl::Status GsaBackward(const SequenceBatch& batch, const GsaBackwardArgs& args) override;
  absl::Status MlstmForward(const SequenceBatch& batch, const MlstmForwardArgs& args,
                            MixerForm form) override;
  absl::Status MlstmBackward(const SequenceBatch& batch, const MlstmBackwardArgs& args) override;

  absl::Status Gemm(const GemmArgs& args) override;
  absl::Status Embedding(const EmbeddingArgs& args) override;
  absl::Status EmbeddingBackward(const EmbeddingBackwardArgs& args) override;
  absl::Status Norm(const NormArgs& args) override;
  absl::Status NormBackward(const NormBackwardArgs& args) override;
  absl::Status Unary(const UnaryArgs& args) override;
  absl::Status UnaryBackward(const UnaryBackwardArgs& args) override;
  absl::Status Binary(const BinaryArgs& args) override;
  absl::Status ReduceSum(const ReduceSumArgs& args) override;
  absl::Status CopyColumns(const CopyColumnsArgs& args) override;
  absl::Status Conv1d(const SequenceBatch& batch, const Conv1dArgs& args) override;
  absl::Status Conv1dBackward(const SequenceBatch& batch, const Conv1dBackwardArgs& args) override;
  absl::Status Rotary(const RotaryArgs& args) override;
  absl::Status Attention(const SequenceBatch& batch, const AttentionArgs& args) override;
  absl::Status AttentionBackward(const SequenceBatch& batch,
                                 const AttentionBackwardArgs& args) override;
  absl::Status CrossEntropy(const CrossEntropyArgs& args) override;

 private:
  const int threads_;  // worker threads for the mixers, resolved (>= 1)
};

}  // namespace lair::kernels::cpu
