// Argument checks shared by the CPU mixer entry points: each returns
// InvalidArgument naming the offending field, so a bad launch is refused
// before any memory is read.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "kernels/mixer.h"

namespace lair::kernels::cpu {

// Which element types a tensor may have.
enum class Floats {
  kF32,  // states, gates and their gradients
  kAny,  // activations: F32, BF16 or F16 (the CPU computes in F32 either way)
};

// OK when `batch` describes `num_tokens` packed tokens: batch.num_seqs >= 0,
// cu_seqlens has num_seqs+1 entries, starts at 0, never decreases and ends at
// num_tokens; state_slot has num_seqs entries in [0, num_slots), pairwise
// distinct when `distinct_slots` (a forward writes every slot it reads).
absl::Status CheckSequenceBatch(const SequenceBatch& batch, int64_t num_tokens, int64_t num_slots,
                                bool distinct_slots);

// OK when `t` is a defined host tensor of exactly `shape` with an allowed dtype.
absl::Status CheckTensor(const Tensor& t, std::string_view name, const Shape& shape, Floats floats);

// As CheckTensor, or OK when `t` is undefined (an optional input or output).
absl::Status CheckOptionalTensor(const Tensor& t, std::string_view name, const Shape& shape,
                                 Floats floats);

// OK when `t` is defined, on the host and of rank `rank`; used before reading
// the sizes a launch derives from it.
absl::Status CheckRank(const Tensor& t, std::string_view name, int rank);

// OK when `value` >= 1.
absl::Status CheckPositive(int64_t value, std::string_view name);

}  // namespace lair::kernels::cpu
