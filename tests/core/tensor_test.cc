#include "core/tensor.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace lair {
namespace {

TEST(TensorTest, ZerosHasShapeAndZeroData) {
  Tensor t = Tensor::Zeros(DType::kF32, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.f32()[i], 0.0f);
}

TEST(TensorTest, RowsAliasesStorage) {
  Tensor t = Tensor::FromFloats({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor middle = t.Rows(1, 2);
  EXPECT_EQ(middle.shape(), (Shape{1, 2}));
  middle.f32()[0] = 42;
  EXPECT_EQ(t.f32()[2], 42);
}

TEST(TensorTest, ExpectShapeNamesTheTensor) {
  Tensor t = Tensor::Zeros(DType::kF32, {2});
  absl::Status s = ExpectShape(t, {3}, "weight.x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("weight.x"), std::string::npos);
}

TEST(TensorTest, RelativeError) {
  Tensor a = Tensor::FromFloats({2}, {3, 4});
  Tensor b = Tensor::FromFloats({2}, {3, 4});
  EXPECT_EQ(RelativeError(a, b), 0.0);
  Tensor c = Tensor::FromFloats({2}, {3, 5});
  EXPECT_NEAR(RelativeError(c, b), 0.2, 1e-12);
}

TEST(TensorTest, RowArgmaxTakesEachRowsFirstLargest) {
  Tensor logits = Tensor::FromFloats({3, 4}, {1, 7, 7, 2,      // a tie: the first
                                              -5, -4, -9, -4,  // negatives
                                              0, 0, 0, 3});
  EXPECT_EQ(RowArgmax(logits), (std::vector<int32_t>{1, 1, 3}));
}

}  // namespace
}  // namespace lair
