#include "engine/scheduler.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/fakes.h"

namespace lair::engine {
namespace {

using testing::FakeRunner;

// Owns request groups and sequences for scheduler tests.
class SchedulerTest : public ::testing::Test {
 protected:
  void Init(int slots, SchedulerConfig config) {
    cache_ = *StateCache::Create(&store_, slots * store_.BytesPerSlot(), slots);
    scheduler_ = std::make_unique<Scheduler>(config, cache_.get());
  }
  Sequence* Add(int prompt_len) {
    auto group = std::make_unique<RequestGroup>();
    group->request.request_id = std::to_string(groups_.size());
    group->request.prompt_tokens.assign(prompt_len, 1);
    auto seq = std::make_unique<Sequence>(static_cast<SequenceId>(seqs_.size()), group.get(), 0,
                                          group->request.prompt_tokens, 0, "");
    groups_.push_back(std::move(group));
    seqs_.push_back(std::move(seq));
    scheduler_->AddWaiting(seqs_.back().get());
    return seqs_.back().get();
  }
  // Token counts scheduled per sequence id.
  static std::map<SequenceId, int> Counts(const ScheduleOutput& out) {
    return {out.num_scheduled_tokens.begin(), out.num_scheduled_tokens.end()};
  }

  FakeRunner store_;
  std::unique_ptr<StateCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<RequestGroup>> groups_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

TEST_F(SchedulerTest, LongPromptIsChunkedUnderTheTokenBudget) {
  Init(4, {.max_batch_tokens = 32, .max_running = 4});
  Sequence* seq = Add(100);
  std::vector<int> chunks;
  for (int step = 0; step < 4; ++step) {
    ScheduleOutput out = scheduler_->Schedule();
    chunks.push_back(out.total_num_scheduled_tokens);
    if (step == 0) {
      ASSERT_EQ(out.new_sequences.size(), 1u);
      EXPECT_EQ(out.new_sequences[0].token_ids.size(), 100u);
    } else {
      ASSERT_EQ(out.cached_sequences.size(), 1u);
      EXPECT_TRUE(out.cached_sequences[0].new_token_ids.empty());
    }
  }
  EXPECT_EQ(chunks, (std::vector<int>{32, 32, 32, 4}));
  EXPECT_EQ(seq->num_computed_tokens, 100);
  seq->AppendToken(7);  // sampled: a gap of one
  ScheduleOutput out = scheduler_->Schedule();
  ASSERT_EQ(out.cached_sequences.size(), 1u);
  EXPECT_EQ(out.cached_sequences[0].new_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(out.total_num_scheduled_tokens, 1);
}

TEST_F(SchedulerTest, RunningGoFirstThenWaitingInArrivalOrder) {
  Init(4, {.max_batch_tokens = 10, .max_running = 4});
  Sequence* a = Add(3);
  scheduler_->Schedule();  // a prefilled
  a->AppendToken(5);
  Sequence* b = Add(8);
  Sequence* c = Add(8);
  ScheduleOutput out = scheduler_->Schedule();
  auto counts = Counts(out);
  EXPECT_EQ(counts[a->id()], 1);
  EXPECT_EQ(counts[b->id()], 8);
  EXPECT_EQ(counts[c->id()], 1);  // what is left of the budget
  EXPECT_EQ(out.num_scheduled_tokens[0].first, a->id());
}

TEST_F(SchedulerTest, FullCacheQueuesAndFreeingAdmitsTheNext) {
  Init(2, {.max_batch_tokens = 100, .max_running = 8});
  Sequence* a = Add(4);
  Sequence* b = Add(4);
  Sequence* c = Add(4);
  ScheduleOutput out = scheduler_->Schedule();
  EXPECT_EQ(out.num_scheduled_tokens.size(), 2u);
  EXPECT_EQ(scheduler_->num_waiting(), 1);
  EXPECT_EQ(c->status, SequenceStatus::kWaiting);
  scheduler_->Free(a);
  EXPECT_EQ(cache_->num_free(), 1);
  b->AppendToken(1);
  out = scheduler_->Schedule();
  EXPECT_EQ(out.finished_ids, std::vector<SequenceId>{a->id()});
  EXPECT_EQ(c->status, SequenceStatus::kRunning);
  EXPECT_EQ(Counts(out)[c->id()], 4);
}

TEST_F(SchedulerTest, SlotBudgetCapsRunningSequences) {
  Init(4, {.max_batch_tokens = 100, .max_running = 4});
  for (int i = 0; i < 6; ++i) Add(2);
  scheduler_->Schedule();
  EXPECT_EQ(scheduler_->num_running(), 4);
  EXPECT_EQ(scheduler_->num_waiting(), 2);
}

TEST_F(SchedulerTest, PreemptionSavesStateAndResumesWithoutRecompute) {
  Init(1, {.max_batch_tokens = 100, .max_running = 1, .preempt_quantum_tokens = 4});
  Sequence* a = Add(4);
  scheduler_->Schedule();
  ASSERT_TRUE(store_.RestoreSlot(a->slot->index(), "99").ok());  // a's "state"
  a->AppendToken(1);
  Sequence* b = Add(2);
  ScheduleOutput out = scheduler_->Schedule();  // a ran 4 >= quantum: preempted for b
  EXPECT_EQ(out.preempted_ids, std::vector<SequenceId>{a->id()});
  EXPECT_EQ(a->status, SequenceStatus::kWaiting);
  EXPECT_EQ(a->saved_state, "99");
  EXPECT_EQ(Counts(out), (std::map<SequenceId, int>{{b->id(), 2}}));
  b->AppendToken(3);
  scheduler_->Schedule();  // b has run 2 < 4: keeps its slot
  EXPECT_EQ(b->status, SequenceStatus::kRunning);
  b->AppendToken(3);
  scheduler_->Schedule();
  b->AppendToken(3);
  out = scheduler_->Schedule();  // b reached 4: a comes back with its state
  EXPECT_EQ(a->status, SequenceStatus::kRunning);
  EXPECT_EQ(*store_.SaveSlot(a->slot->index()), "99");
  ASSERT_EQ(out.new_sequences.size(), 1u);
  EXPECT_EQ(out.new_sequences[0].num_computed_tokens, 4);
  EXPECT_EQ(Counts(out)[a->id()], 1);  // only the sampled token, no recompute
  EXPECT_EQ(scheduler_->preemptions_total(), 2);
}

}  // namespace
}  // namespace lair::engine
