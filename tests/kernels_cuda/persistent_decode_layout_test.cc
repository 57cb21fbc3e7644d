// The persistent decode kernel's layout rules (kernels/cuda/persistent_decode.h)
// on the host: where a weight tile puts each element, how a phase's units
// split over the CTAs, and which shapes the kernel takes. Needs no GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/persistent_decode.h"

namespace lair::kernels::cuda {
namespace {

// GLA 1.3B: 4 heads of 256 keys and 512 values, rank 16, 5,632 MLP columns.
PersistentDecodeDims Gla13b() {
  PersistentDecodeDims d;
  d.hidden = 2048, d.ffn = 5632, d.vocab = 32000, d.layers = 24;
  d.heads = 4, d.dk = 256, d.dv = 512, d.rank = 16;
  return d;
}

TEST(PersistentDecodeLayout, TileHoldsEachElementOnceInFragmentOrder) {
  std::set<int> offsets;
  for (int r = 0; r < kDecodeTileRows; ++r)
    for (int k = 0; k < kDecodeTileCols; ++k) {
      const int at = PersistentDecodeTileOffset(r, k);
      EXPECT_EQ(at % 2, 0);
      EXPECT_LT(at, kDecodeTileBytes);
      offsets.insert(at);
    }
  EXPECT_EQ(offsets.size(), static_cast<size_t>(kDecodeTileRows * kDecodeTileCols));
  // Lane l of k-step s reads its m16n8k16 A fragment as 16 bytes at s·512 + 16l.
  for (int step = 0; step < kDecodeTileCols / 16; ++step)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4, k0 = 16 * step;
      const std::pair<int, int> fragment[8] = {{g, k0 + 2 * t},         {g, k0 + 2 * t + 1},
                                               {g + 8, k0 + 2 * t},     {g + 8, k0 + 2 * t + 1},
                                               {g, k0 + 2 * t + 8},     {g, k0 + 2 * t + 9},
                                               {g + 8, k0 + 2 * t + 8}, {g + 8, k0 + 2 * t + 9}};
      for (int i = 0; i < 8; ++i)
        EXPECT_EQ(PersistentDecodeTileOffset(fragment[i].first, fragment[i].second),
                  step * 512 + lane * 16 + 2 * i)
            << "step " << step << " lane " << lane << " element " << i;
    }
}

TEST(PersistentDecodeLayout, ColumnTileHoldsEachElementOnceAsFragments) {
  std::set<int> offsets;
  for (int r = 0; r < kDecodeTileCols; ++r)
    for (int k = 0; k < kDecodeSliceCols; ++k) {
      const int at = PersistentDecodeColumnTileOffset(r, k);
      EXPECT_LT(at, kDecodeTileBytes);
      offsets.insert(at);
      // Fragment f holds rows 16f..16f+15 as a row tile's first k-step.
      EXPECT_EQ(at, (r / 16) * 512 + PersistentDecodeTileOffset(r % 16, k));
    }
  EXPECT_EQ(offsets.size(), static_cast<size_t>(kDecodeTileCols * kDecodeSliceCols));
}

TEST(PersistentDecodeLayout, GroupsSplitEvenlyOverTheCtas) {
  for (int groups : {0, 1, 128, 385, 704, 2000})
    for (int ctas : {1, 7, 132}) {
      int covered = 0;
      for (int c = 0; c < ctas; ++c) {
        const int mine = GroupBegin(groups, ctas, c + 1) - GroupBegin(groups, ctas, c);
        EXPECT_GE(mine, groups / ctas);
        EXPECT_LE(mine, (groups + ctas - 1) / ctas);
        covered += mine;
      }
      EXPECT_EQ(GroupBegin(groups, ctas, 0), 0);
      EXPECT_EQ(covered, groups) << groups << " groups over " << ctas;
    }
}

TEST(PersistentDecodeLayout, PhasesOfGla13b) {
  const PersistentDecodeDims d = Gla13b();
  EXPECT_EQ(d.MixerInRows(), 1024 + 1024 + 2048 + 2048 + 16);
  EXPECT_EQ(d.Units(DecodePhase::kMixerIn), 385);
  EXPECT_EQ(d.Units(DecodePhase::kMixerOut), 128);  // 16-column slices of o
  EXPECT_EQ(d.Units(DecodePhase::kMlpIn), 704);     // 8 gate/up pairs a group
  EXPECT_EQ(d.Units(DecodePhase::kMlpOut), 352);    // 16-column slices of the SwiGLU output
  EXPECT_EQ(d.Units(DecodePhase::kHead), 2000);
  EXPECT_EQ(d.Cols(DecodePhase::kMixerOut), 2048);
  EXPECT_EQ(d.Cols(DecodePhase::kMlpOut), 5632);
  EXPECT_EQ(d.TilesPerUnit(DecodePhase::kMixerIn), 8);  // 256-column blocks of 2,048
  EXPECT_EQ(d.TilesPerUnit(DecodePhase::kMlpOut), 8);   // 256-row blocks of 2,048
  EXPECT_TRUE(IsColumnPhase(DecodePhase::kMixerOut));
  EXPECT_FALSE(IsColumnPhase(DecodePhase::kMlpIn));
  PersistentDecodeDims ungated = d;
  ungated.output_gate = false;
  EXPECT_EQ(ungated.MixerInRows(), 1024 + 1024 + 2048 + 16);
}

// Every unit of every phase goes to exactly one CTA; o_proj's slice of a CTA
// is the value columns its state step made, and down's columns are the
// SwiGLU units its gate/up rows made (no barrier between).
TEST(PersistentDecodeLayout, SharesCoverEachPhaseAndChainWithoutBarriers) {
  const PersistentDecodeDims d = Gla13b();
  for (int ctas : {128, 132}) {
    for (DecodePhase phase : {DecodePhase::kMixerIn, DecodePhase::kMixerOut, DecodePhase::kMlpIn,
                              DecodePhase::kMlpOut, DecodePhase::kHead}) {
      int next = 0;
      for (int c = 0; c < ctas; ++c) {
        const DecodeShare share = PhaseShare(d, phase, ctas, c);
        if (share.count > 0) {
          EXPECT_EQ(share.begin, next) << "CTA " << c;
        }
        next += share.count;
      }
      EXPECT_EQ(next, d.Units(phase)) << static_cast<int>(phase) << " over " << ctas;
    }
    for (int c = 0; c < ctas; ++c) {
      const DecodeShare out = PhaseShare(d, DecodePhase::kMixerOut, ctas, c);
      EXPECT_EQ(out.count, c < 128 ? 1 : 0);
      if (out.count) {
        EXPECT_EQ(out.begin, c);
      }
      const DecodeShare in = PhaseShare(d, DecodePhase::kMlpIn, ctas, c);
      const DecodeShare down = PhaseShare(d, DecodePhase::kMlpOut, ctas, c);
      // 8 gate/up pairs a group: two groups make one 16-column slice.
      EXPECT_EQ(in.begin, 2 * down.begin);
      EXPECT_EQ(in.count, 2 * down.count);
    }
  }
}

// The head's argmax as one integer max picks what ArgmaxRows picks: the
// largest logit, the first of equal ones; NaN and -inf never (0 when
// nothing else is left).
TEST(PersistentDecodeLayout, ArgmaxKeysPickWhatArgmaxRowsPicks) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> rows = {
      {0.5f, -1.0f, 2.0f, 2.0f, 1.0f},  // a tie: the first
      {-3.0f, -2.5f, -7.0f},            // negatives
      {-inf, -inf, -1e30f},             // -inf below every finite value
      {-0.0f, 0.0f},                    // signed zeros compare equal: the first
      {nan, 1.0f, nan, 3.0f},           // NaN skipped
      {1e-40f, 0.0f, -1e-40f},          // subnormals
      {inf, 3.0f, inf},
      {nan, -inf, -inf},  // no candidate: 0
      {-inf, nan, -3.0f}};
  for (const std::vector<float>& row : rows) {
    unsigned long long best = 0;
    for (size_t i = 0; i < row.size(); ++i)
      best = std::max(best, DecodeArgmaxKey(row[i], static_cast<int>(i)));
    // ArgmaxRows's scan: a value beats the best so far if larger, from
    // -FLT_MAX and no index (which neither NaN nor -inf beats).
    float top = -std::numeric_limits<float>::max();
    size_t want = row.size();
    for (size_t i = 0; i < row.size(); ++i)
      if (row[i] > top || (row[i] == top && want == row.size())) top = row[i], want = i;
    if (want == row.size()) want = 0;
    EXPECT_EQ(DecodeArgmaxIndex(best), static_cast<int32_t>(want)) << ::testing::PrintToString(row);
  }
  EXPECT_EQ(DecodeArgmaxKey(nan, 7), 0u);
  EXPECT_EQ(DecodeArgmaxIndex(0), 0);
  EXPECT_EQ(DecodeArgmaxIndex(DecodeArgmaxKey(-1e30f, 31999)), 31999);
}

TEST(PersistentDecodeLayout, SupportsGla13bOnEnoughSms) {
  const PersistentDecodeDims d = Gla13b();
  EXPECT_TRUE(PersistentDecodeSupports(d, 132));
  // The state step gives each CTA 16 value columns: 128 of them.
  EXPECT_FALSE(PersistentDecodeSupports(d, 100));
  PersistentDecodeDims narrow = d;
  narrow.dk = 128;  // a key a consumer thread
  EXPECT_FALSE(PersistentDecodeSupports(narrow, 132));
  PersistentDecodeDims wide_rank = d;
  wide_rank.rank = 32;
  EXPECT_FALSE(PersistentDecodeSupports(wide_rank, 132));
  PersistentDecodeDims odd = d;
  odd.hidden = 2000;  // not whole tiles
  EXPECT_FALSE(PersistentDecodeSupports(odd, 132));
  PersistentDecodeDims odd_ffn = d;
  odd_ffn.ffn = 5640;  // not whole 16-column slices
  EXPECT_FALSE(PersistentDecodeSupports(odd_ffn, 132));
  PersistentDecodeDims wide = d;
  wide.hidden = 4096;  // x past the float4s a thread reads
  EXPECT_FALSE(PersistentDecodeSupports(wide, 132));
}

}  // namespace
}  // namespace lair::kernels::cuda
