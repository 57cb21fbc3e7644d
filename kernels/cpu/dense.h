// The dense operations of kernels/dense.h on the CPU: the fp32 reference the
// CUDA backend is tested against. Gemm goes through OpenBLAS; the rest are
// plain loops with reductions accumulated in double. CpuBackend forwards its
// dense Backend methods here one to one; the contracts (shapes, dtypes, what
// is written or accumulated, the errors) are those of kernels/dense.h, and
// every tensor must be a host tensor.
//
// Thread safety: the functions keep no state; calls on disjoint outputs may
// run concurrently.
#pragma once

#include "kernels/dense.h"
#include "kernels/mixer.h"

namespace lair::kernels::cpu {

absl::Status GemmCpu(const GemmArgs& args);
absl::Status EmbeddingCpu(const EmbeddingArgs& args);
absl::Status EmbeddingBackwardCpu(const EmbeddingBackwardArgs& args);
absl::Status NormCpu(const NormArgs& args);
absl::Status NormBackwardCpu(const NormBackwardArgs& args);
absl::Status UnaryCpu(const UnaryArgs& args);
absl::Status UnaryBackwardCpu(const UnaryBackwardArgs& args);
absl::Status BinaryCpu(const BinaryArgs& args);
absl::Status ReduceSumCpu(const ReduceSumArgs& args);
absl::Status CopyColumnsCpu(const CopyColumnsArgs& args);
absl::Status Conv1dCpu(const SequenceBatch& batch, const Conv1dArgs& args);
absl::Status Conv1dBackwardCpu(const SequenceBatch& batch, const Conv1dBackwardArgs& args);
absl::Status RotaryCpu(const RotaryArgs& args);
absl::Status AttentionCpu(const SequenceBatch& batch, const AttentionArgs& args);
absl::Status AttentionBackwardCpu(const SequenceBatch& batch, const AttentionBackwardArgs& args);
absl::Status CrossEntropyCpu(const CrossEntropyArgs& args);

}  // namespace lair::kernels::cpu
