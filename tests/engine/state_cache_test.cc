#include "engine/state_cache.h"

#include "gtest/gtest.h"
#include "tests/engine/fakes.h"

namespace lair::engine {
namespace {

using testing::FakeRunner;

TEST(StateCacheTest, SizesFromBudgetAndCapsAtMaxSlots) {
  FakeRunner store(512, /*bytes_per_slot=*/1000);
  auto cache = StateCache::Create(&store, /*budget_bytes=*/5500, /*max_slots=*/8);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->num_slots(), 5);
  EXPECT_EQ((*cache)->bytes_per_slot(), 1000);
  FakeRunner store2(512, 1000);
  auto capped = StateCache::Create(&store2, 1'000'000, 3);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ((*capped)->num_slots(), 3);
}

TEST(StateCacheTest, BudgetBelowOneSlotNamesTheField) {
  FakeRunner store(512, 1000);
  auto cache = StateCache::Create(&store, 999, 8);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cache.status().message().find("state_memory_bytes"), std::string::npos);
}

TEST(StateCacheTest, FullCacheIsResourceExhaustedAndFreedSlotsAreReused) {
  FakeRunner store(512, 100);
  auto cache = StateCache::Create(&store, 200, 8);
  ASSERT_TRUE(cache.ok());
  auto a = (*cache)->Allocate();
  auto b = (*cache)->Allocate();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->index(), 0);
  EXPECT_EQ(b->index(), 1);
  auto c = (*cache)->Allocate();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  (*cache)->Free(*a);
  EXPECT_EQ((*cache)->num_free(), 1);
  auto d = (*cache)->Allocate();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index(), 0);
}

TEST(StateCacheTest, CopySaveAndRestoreCarryTheState) {
  FakeRunner store(512, 100);
  auto cache = StateCache::Create(&store, 300, 8);
  ASSERT_TRUE(cache.ok());
  auto a = (*cache)->Allocate();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(store.RestoreSlot(a->index(), "12345").ok());  // give it a state
  auto copy = (*cache)->AllocateCopy(*a);
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(*store.SaveSlot(copy->index()), "12345");
  auto saved = (*cache)->Save(*a);
  ASSERT_TRUE(saved.ok());
  (*cache)->Free(*a);
  auto restored = (*cache)->AllocateRestored(*saved);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(*store.SaveSlot(restored->index()), "12345");
  auto fresh = (*cache)->Allocate();
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*store.SaveSlot(fresh->index()), "0");  // zeroed
}

}  // namespace
}  // namespace lair::engine
