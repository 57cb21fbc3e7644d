// StatePool: fixed-size per-sequence state slots on one backend's device.
//
// Layout: for each state tensor a model declares (say layer 3's recurrent
// state [H,K,V], or its conv window [D,W-1]), the pool holds one tensor
// [num_slots, ...shape]; slot i is row i of every such tensor. A sequence's
// whole state is therefore "row i everywhere", of StateLayout::BytesPerSlot().
//
// Slots can be copied (n > 1 completions share a prefill), saved to host
// bytes and restored (preemption, prefix snapshots), and zeroed on reuse.
//
// Thread safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace lair::models {

struct StateTensorSpec {
  std::string name;  // "layers.3.recurrent", for messages and serialization
  DType dtype = DType::kF32;
  Shape shape;  // per slot
};

struct StateLayout {
  std::vector<StateTensorSpec> tensors;
  int64_t BytesPerSlot() const;
};

class StatePool {
 public:
  // Allocates num_slots zeroed slots on `backend` (which must outlive it).
  static absl::StatusOr<StatePool> Create(kernels::Backend* backend, const StateLayout& layout,
                                          int num_slots);

  int num_slots() const { return num_slots_; }
  const StateLayout& layout() const { return layout_; }
  // The pool tensor [num_slots, ...] for layout().tensors[index].
  const Tensor& tensor(int index) const { return tensors_[index]; }

  absl::Status Zero(int slot);
  absl::Status CopySlot(int from, int to);
  // One slot's state as self-describing host bytes (names, dtypes, shapes
  // checked on Restore), so a saved state cannot be restored into another model.
  absl::StatusOr<std::string> Save(int slot);
  absl::Status Restore(int slot, const std::string& bytes);

 private:
  kernels::Backend* backend_ = nullptr;
  StateLayout layout_;
  int num_slots_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace lair::models
