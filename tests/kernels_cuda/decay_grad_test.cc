// cuda::LaunchDecayGrad (kernels/cuda/decay_grad.cu) against a host reverse
// cumsum: feature dims 64 to 512, per-feature and reduced, plain and
// transposed final-state terms, packed sequences of thousands of tokens with
// ragged and empty ones; dx and dy stored on the way (bf16 and fp32). Also
// the one-warp-per-row kernels (softmax and its Jacobian) on more rows than
// their capped grid holds warps. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/mixer_backward.h"
#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {
namespace {

// A device copy of a host vector, freed with the object.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), size_ * sizeof(T) + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  std::vector<T> Host() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t size_;
};

class DecayGradTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no CUDA device";
  }
  std::vector<float> Rand(size_t n) {
    std::vector<float> x(n);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (float& v : x) v = dist(rng_);
    return x;
  }
  std::mt19937 rng_{11};
};

TEST_F(DecayGradTest, MatchesHostReverseCumsum) {
  const std::vector<int32_t> offsets = {0, 4099, 4099, 4100, 5613};
  const int S = static_cast<int>(offsets.size()) - 1, H = 3, other = 24;
  const int64_t N = offsets.back();
  for (int dim : {64, 128, 256, 512}) {
    for (bool reduce : {false, true}) {
      for (bool transposed : {false, true}) {
        const size_t elems = static_cast<size_t>(N) * H * dim;
        const std::vector<float> x = Rand(elems), dx = Rand(elems), y = Rand(elems),
                                 dy = Rand(elems);
        const std::vector<float> ds = Rand(static_cast<size_t>(S) * H * dim * other);
        const std::vector<float> st = Rand(ds.size());
        const int cols = reduce ? 1 : dim;
        DeviceVector<int32_t> cu(offsets);
        DeviceVector<float> dx_d(dx), x_d(x), y_d(y), dy_d(dy), ds_d(ds), st_d(st);
        DeviceVector<float> out(std::vector<float>(static_cast<size_t>(N) * H * cols, 7.0f));
        DeviceVector<uint16_t> dx_bf16(std::vector<uint16_t>(elems, 0));
        DeviceVector<float> dy_copy(std::vector<float>(elems, 7.0f));
        DecayGradParams p;
        p.num_seqs = S, p.heads = H, p.dim = dim, p.other = other, p.tokens = N;
        p.cu_seqlens = cu.get();
        p.x = {x_d.get(), ElemType::kF32}, p.dx = {dx_d.get(), ElemType::kF32};
        p.y = {y_d.get(), ElemType::kF32}, p.dy = {dy_d.get(), ElemType::kF32};
        p.d_state = ds_d.get(), p.state = st_d.get();
        p.transposed = transposed, p.reduce_features = reduce;
        p.out = out.get();
        p.dx_out = dx_bf16.get(), p.dx_out_type = ElemType::kBF16;
        p.dy_out = dy_copy.get(), p.dy_out_type = ElemType::kF32;
        ASSERT_EQ(LaunchDecayGrad(p, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got = out.Host();
        EXPECT_EQ(dy_copy.Host(), dy) << "dy stored as fp32";
        const std::vector<uint16_t> dx_rounded = dx_bf16.Host();
        double dx_worst = 0.0;
        for (size_t i = 0; i < elems; ++i) {
          const uint32_t bits = static_cast<uint32_t>(dx_rounded[i]) << 16;
          float v;
          std::memcpy(&v, &bits, 4);
          dx_worst = std::max(dx_worst, std::fabs(static_cast<double>(v) - dx[i]));
        }
        EXPECT_LE(dx_worst, 1.0 / 256) << "dx stored as bf16";

        // Host reference in double.
        double worst = 0.0, norm = 0.0;
        for (int s = 0; s < S; ++s)
          for (int h = 0; h < H; ++h)
            for (int c = 0; c < cols; ++c) {
              double run = 0.0;
              const int a0 = reduce ? 0 : c, a1 = reduce ? dim : c + 1;
              for (int a = a0; a < a1; ++a)
                for (int b = 0; b < other; ++b) {
                  const size_t base = (static_cast<size_t>(s) * H + h) * dim * other;
                  const size_t i = base + (transposed ? static_cast<size_t>(b) * dim + a
                                                      : static_cast<size_t>(a) * other + b);
                  run += static_cast<double>(ds[i]) * st[i];
                }
              for (int64_t t = offsets[s + 1] - 1; t >= offsets[s]; --t) {
                for (int a = a0; a < a1; ++a) {
                  const size_t i = (static_cast<size_t>(t) * H + h) * dim + a;
                  run += static_cast<double>(x[i]) * dx[i] - static_cast<double>(y[i]) * dy[i];
                }
                const double g = got[(static_cast<size_t>(t) * H + h) * cols + c];
                worst = std::max(worst, std::fabs(g - run));
                norm = std::max(norm, std::fabs(run));
              }
            }
        EXPECT_LE(worst, 1e-4 * std::max(norm, 1.0))
            << "dim " << dim << (reduce ? " reduced" : "") << (transposed ? " transposed" : "");
      }
    }
  }
}

// Blocks caps a grid at 65,535·16 CTAs, so a one-warp-per-row launch of
// eight warps a CTA holds fewer warps than 8.4 million rows: each warp must
// take several. Rows of width 2 past the cap, checked where the second pass
// of warps lands.
TEST_F(DecayGradTest, RowKernelsReachRowsPastTheGridCap) {
  const int64_t rows = int64_t{65535} * 16 * 8 + 37;
  const int width = 2;
  const std::vector<float> x = Rand(static_cast<size_t>(rows) * width);
  const std::vector<float> dp = Rand(x.size());
  DeviceVector<float> p_d(x), dp_d(dp);
  ASSERT_EQ(LaunchSoftmaxRows(p_d.get(), rows, width, p_d.get(), ElemType::kF32, nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchSoftmaxBackward(p_d.get(), dp_d.get(), rows, width, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> p = p_d.Host(), got = dp_d.Host();
  double worst_p = 0.0, worst_dp = 0.0;
  for (int64_t r = rows - 4096; r < rows; ++r) {
    const size_t i = static_cast<size_t>(r) * width;
    const double e0 = std::exp(static_cast<double>(x[i]) - std::max(x[i], x[i + 1]));
    const double e1 = std::exp(static_cast<double>(x[i + 1]) - std::max(x[i], x[i + 1]));
    const double p0 = e0 / (e0 + e1), p1 = e1 / (e0 + e1);
    const double dot = p0 * dp[i] + p1 * dp[i + 1];
    worst_p = std::max({worst_p, std::fabs(p[i] - p0), std::fabs(p[i + 1] - p1)});
    worst_dp = std::max({worst_dp, std::fabs(got[i] - p0 * (dp[i] - dot)),
                         std::fabs(got[i + 1] - p1 * (dp[i + 1] - dot))});
  }
  EXPECT_LE(worst_p, 1e-6);
  EXPECT_LE(worst_dp, 1e-5);
}

}  // namespace
}  // namespace lair::kernels::cuda
