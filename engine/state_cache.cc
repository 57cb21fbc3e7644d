#include "engine/state_cache.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace lair::engine {

absl::StatusOr<std::unique_ptr<StateCache>> StateCache::Create(SlotStore* store,
                                                               int64_t budget_bytes,
                                                               int max_slots) {
  const int64_t bytes_per_slot = store->BytesPerSlot();
  if (bytes_per_slot <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("state layout: bytes per slot must be positive, got ", bytes_per_slot));
  }
  if (max_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_running must be at least 1, got ", max_slots));
  }
  const int64_t fit = budget_bytes / bytes_per_slot;
  if (fit < 1) {
    return absl::InvalidArgumentError(absl::StrCat("state_memory_bytes: ", budget_bytes,
                                                   " bytes cannot hold one state slot of ",
                                                   bytes_per_slot, " bytes"));
  }
  const int num_slots = static_cast<int>(std::min<int64_t>(fit, max_slots));
  LAIR_RETURN_IF_ERROR(store->CreateSlots(num_slots));
  std::fprintf(
      stderr, "lair engine: %d state slots of %lld bytes (%lld bytes in all, budget %lld)\n",
      num_slots, static_cast<long long>(bytes_per_slot),
      static_cast<long long>(bytes_per_slot) * num_slots, static_cast<long long>(budget_bytes));
  return std::unique_ptr<StateCache>(new StateCache(store, num_slots, bytes_per_slot));
}

StateCache::StateCache(SlotStore* store, int num_slots, int64_t bytes_per_slot)
    : store_(store), num_slots_(num_slots), bytes_per_slot_(bytes_per_slot), held_(num_slots) {
  for (int i = num_slots - 1; i >= 0; --i) free_.push_back(i);
}

absl::StatusOr<StateSlot> StateCache::Take() {
  if (free_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("state cache: all ", num_slots_, " slots are in use"));
  }
  const int index = free_.back();
  free_.pop_back();
  held_[index] = true;
  return StateSlot(index);
}

absl::StatusOr<StateSlot> StateCache::Allocate() {
  LAIR_ASSIGN_OR_RETURN(StateSlot slot, Take());
  if (absl::Status s = store_->ZeroSlot(slot.index()); !s.ok()) {
    Free(slot);
    return s;
  }
  return slot;
}

absl::StatusOr<StateSlot> StateCache::AllocateCopy(StateSlot from) {
  LAIR_CHECK(held_[from.index()]);
  LAIR_ASSIGN_OR_RETURN(StateSlot slot, Take());
  if (absl::Status s = store_->CopySlot(from.index(), slot.index()); !s.ok()) {
    Free(slot);
    return s;
  }
  return slot;
}

absl::StatusOr<StateSlot> StateCache::AllocateRestored(const std::string& saved) {
  LAIR_ASSIGN_OR_RETURN(StateSlot slot, Take());
  if (absl::Status s = store_->RestoreSlot(slot.index(), saved); !s.ok()) {
    Free(slot);
    return s;
  }
  return slot;
}

absl::StatusOr<std::string> StateCache::Save(StateSlot slot) {
  LAIR_CHECK(held_[slot.index()]);
  return store_->SaveSlot(slot.index());
}

void StateCache::Free(StateSlot slot) {
  LAIR_CHECK(slot.index() >= 0 && slot.index() < num_slots_ && held_[slot.index()]);
  held_[slot.index()] = false;
  // Keep free_ sorted highest first so the lowest index is reused first.
  auto pos = std::lower_bound(free_.begin(), free_.end(), slot.index(), std::greater<int>());
  free_.insert(pos, slot.index());
}

}  // namespace lair::engine
