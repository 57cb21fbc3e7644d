// Backend: the one interface between model code and the hardware.
//
// The model code in models/ is written once against this interface. The CPU
// backend (kernels/cpu/) is the exact fp32 reference, built on OpenBLAS; the
// CUDA backend (kernels/cuda/) runs the same operations on a GPU. Tensors
// passed to a backend live on its device(); Allocate/Upload/Download move data.
//
// Every operation validates its arguments and returns InvalidArgument naming
// the bad field rather than reading out of bounds. Operations on one backend
// are issued in order (one CUDA stream); Synchronize waits for them.
//
// Thread safety: a Backend is used by one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "kernels/dense.h"
#include "kernels/mixer.h"

namespace lair::kernels {

// How a mixer forward runs. kAuto picks the recurrent form for one-token
// steps and the chunked form otherwise.
enum class MixerForm { kAuto, kChunked, kRecurrent };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string Name() const = 0;

  // --- Memory -------------------------------------------------------------
  // A zero-filled tensor on this backend's device.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, Shape shape) = 0;
  // Copies a host tensor to this device (converting to `dtype`).
  virtual absl::StatusOr<Tensor> Upload(const Tensor& host, DType dtype) = 0;
  // Copies a device tensor to a new host tensor of the same dtype.
  virtual absl::StatusOr<Tensor> Download(const Tensor& device_tensor) = 0;
  // Copies src into dst (same dtype and element count, both on this device).
  virtual absl::Status Copy(const Tensor& src, const Tensor& dst) = 0;
  virtual absl::Status Synchronize() = 0;

  // --- Mixers (see kernels/mixer.h for the math and layouts) ---------------
  virtual absl::Status DecayForward(const SequenceBatch& batch, const DecayForwardArgs& args,
                                    MixerForm form) = 0;
  virtual absl::Status DecayBackward(const SequenceBatch& batch, const DecayBackwardArgs& args) = 0;
  virtual absl::Status GsaForward(const SequenceBatch& batch, const GsaForwardArgs& args,
                                  MixerForm form) = 0;
  virtual absl::Status GsaBackward(const SequenceBatch& batch, const GsaBackwardArgs& args) = 0;
  virtual absl::Status MlstmForward(const SequenceBatch& batch, const MlstmForwardArgs& args,
                                    MixerForm form) = 0;
  virtual absl::Status MlstmBackward(const SequenceBatch& batch, const MlstmBackwardArgs& args) = 0;

  // --- Dense operations used by the model skeleton ------------------------
  // Argument structs, shapes and math in kernels/dense.h. CPU: kernels/cpu/dense.cc.
  virtual absl::Status Gemm(const GemmArgs& args) = 0;
  virtual absl::Status Embedding(const EmbeddingArgs& args) = 0;
  virtual absl::Status EmbeddingBackward(const EmbeddingBackwardArgs& args) = 0;
  virtual absl::Status Norm(const NormArgs& args) = 0;
  virtual absl::Status NormBackward(const NormBackwardArgs& args) = 0;
  virtual absl::Status Unary(const UnaryArgs& args) = 0;
  virtual absl::Status UnaryBackward(const UnaryBackwardArgs& args) = 0;
  virtual absl::Status Binary(const BinaryArgs& args) = 0;
  virtual absl::Status ReduceSum(const ReduceSumArgs& args) = 0;
  virtual absl::Status CopyColumns(const CopyColumnsArgs& args) = 0;
  virtual absl::Status Conv1d(const SequenceBatch& batch, const Conv1dArgs& args) = 0;
  virtual absl::Status Conv1dBackward(const SequenceBatch& batch,
                                      const Conv1dBackwardArgs& args) = 0;
  virtual absl::Status Rotary(const RotaryArgs& args) = 0;
  virtual absl::Status Attention(const SequenceBatch& batch, const AttentionArgs& args) = 0;
  virtual absl::Status AttentionBackward(const SequenceBatch& batch,
                                         const AttentionBackwardArgs& args) = 0;
  virtual absl::Status CrossEntropy(const CrossEntropyArgs& args) = 0;
};

// The fp32 reference backend. `threads` <= 0 uses every core.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

// "cpu" or "cuda" (or "cuda:N"). Unimplemented when LAIR was built without
// CUDA; Unavailable when no GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(std::string_view device);

}  // namespace lair::kernels
