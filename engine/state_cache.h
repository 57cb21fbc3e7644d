// StateCache: the pool of fixed-size recurrent-state slots, as the scheduler
// sees it.
//
// A linear-attention sequence's whole context is one fixed-size state, so the
// cache is a set of equal slots rather than growing block lists:
//
//   device pool (held by the SlotStore, i.e. the model runner)
//   +--------+--------+--------+-----+------------+
//   | slot 0 | slot 1 | slot 2 | ... | slot S - 1 |   S = min(max_slots, budget / bytes_per_slot)
//   +--------+--------+--------+-----+------------+
//   each slot = one sequence's state after its num_computed_tokens tokens
//
//   host memory (held by the Sequence, unbounded)
//   saved_state: Save(slot) bytes of a preempted sequence, or of a prompt's
//   state awaiting a slot for an n > 1 sibling; Restore puts it back exactly,
//   so nothing is recomputed.
//
// A slot is held by exactly one running sequence; finished, cancelled, failed
// and preempted sequences give theirs back at once. Allocation never blocks
// and never crashes: a full cache answers ResourceExhausted and the request
// keeps waiting.
//
// Thread safety: thread-compatible; owned by the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace lair::engine {

// An allocated slot. Opaque to the scheduler; the runner reads index().
class StateSlot {
 public:
  explicit StateSlot(int index) : index_(index) {}
  int index() const { return index_; }
  bool operator==(const StateSlot& other) const = default;

 private:
  int index_;
};

// The device side of the slots: whoever owns the model's state memory (the
// model runner) implements it. Indices are in [0, num_slots).
class SlotStore {
 public:
  virtual ~SlotStore() = default;
  virtual int64_t BytesPerSlot() const = 0;
  // Allocates the device pool. Called once, before any other slot call.
  virtual absl::Status CreateSlots(int num_slots) = 0;
  virtual absl::Status ZeroSlot(int slot) = 0;
  virtual absl::Status CopySlot(int from, int to) = 0;
  // A host copy of one slot's state, for RestoreSlot.
  virtual absl::StatusOr<std::string> SaveSlot(int slot) = 0;
  virtual absl::Status RestoreSlot(int slot, const std::string& bytes) = 0;
};

class StateCache {
 public:
  // Sizes the pool as min(max_slots, budget_bytes / store->BytesPerSlot()),
  // creates it in `store` (which must outlive the cache) and logs the slot
  // count and bytes per slot to stderr. InvalidArgument when budget_bytes
  // does not hold one slot (the message names state_memory_bytes).
  static absl::StatusOr<std::unique_ptr<StateCache>> Create(SlotStore* store, int64_t budget_bytes,
                                                            int max_slots);

  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  // A zeroed slot; ResourceExhausted when every slot is held.
  absl::StatusOr<StateSlot> Allocate();
  // A slot holding a copy of `from` (n > 1 siblings after a shared prefill).
  absl::StatusOr<StateSlot> AllocateCopy(StateSlot from);
  // A slot holding `saved` (from Save), for a resumed sequence.
  absl::StatusOr<StateSlot> AllocateRestored(const std::string& saved);
  // Host bytes of `slot`'s state; the slot stays held.
  absl::StatusOr<std::string> Save(StateSlot slot);
  // Gives `slot` back. REQUIRES: `slot` is held.
  void Free(StateSlot slot);

  int num_slots() const { return num_slots_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int64_t bytes_per_slot() const { return bytes_per_slot_; }

 private:
  StateCache(SlotStore* store, int num_slots, int64_t bytes_per_slot);
  // Takes the lowest free index; ResourceExhausted when none.
  absl::StatusOr<StateSlot> Take();

  SlotStore* const store_;
  const int num_slots_;
  const int64_t bytes_per_slot_;
  std::vector<int> free_;   // free indices, highest first (so back() is the lowest)
  std::vector<bool> held_;  // [num_slots] whether each slot is allocated
};

}  // namespace lair::engine
