// The fixture the CUDA mixer tests share: a CUDA backend (the test skips
// without one) and the CPU reference, random host tensors, uploads that also
// give the values the CPU should see (rounded through the GPU dtype), and a
// ragged packed batch whose sequences sit in shuffled slots.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace lair::kernels {

class CudaVsCpuTest : public ::testing::Test {
 protected:
  explicit CudaVsCpuTest(uint32_t seed) : rng_(seed) {}

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeBackend("cuda", gpu_options_);
    if (!gpu.ok()) GTEST_SKIP() << "no CUDA backend here: " << gpu.status().message();
    gpu_ = std::move(*gpu);
    cpu_ = MakeCpuBackend();
  }

  Tensor Rand(Shape shape, float lo, float hi) {
    Tensor t = Tensor::Zeros(DType::kF32, std::move(shape));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng_);
    return t;
  }
  // Host tensor → GPU tensor of dtype `dt`.
  Tensor Gpu(const Tensor& host, DType dt) {
    absl::StatusOr<Tensor> t = gpu_->Upload(host, dt);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }
  // What the CPU should see: the host values rounded through `dt`.
  Tensor Cpu(const Tensor& host, DType dt) {
    return dt == DType::kF32 ? host.Clone() : Down(Gpu(host, dt)).ToF32();
  }
  Tensor Down(const Tensor& device) {
    absl::StatusOr<Tensor> t = gpu_->Download(device);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }
  void Expect(const Tensor& gpu_tensor, const Tensor& cpu_tensor, double tol,
              const std::string& what) {
    const double err = RelativeError(Down(gpu_tensor).ToF32(), cpu_tensor);
    EXPECT_LE(err, tol) << what;
    EXPECT_FALSE(std::isnan(err)) << what;
  }

  // Sequence s of `lens` in slot lens.size() − s of a pool of lens.size() + 1.
  void MakeBatch(const std::vector<int>& lens) {
    offsets_ = {0};
    for (int len : lens) offsets_.push_back(offsets_.back() + len);
    slots_.clear();
    for (size_t s = 0; s < lens.size(); ++s)
      slots_.push_back(static_cast<int32_t>(lens.size() - s));
    batch_ = SequenceBatch{};
    batch_.num_seqs = static_cast<int>(lens.size());
    batch_.cu_seqlens = offsets_;
    batch_.state_slot = slots_;
    for (int len : lens) batch_.max_seqlen = std::max(batch_.max_seqlen, len);
  }

  std::mt19937 rng_;
  BackendOptions gpu_options_;  // set by a derived constructor, read by SetUp
  std::unique_ptr<Backend> gpu_, cpu_;
  std::vector<int32_t> offsets_, slots_;
  SequenceBatch batch_;
};

}  // namespace lair::kernels
