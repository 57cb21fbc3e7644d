// The host's share of a batch-1 decode step, without the step: the round
// trip of launching a kernel shaped like the persistent decode kernel (one
// CTA per SM, 288 threads, 220 KB of shared memory) that writes one int, and
// reading that int back, in the ways a decode loop could. Prints each way's
// median, 10th and 90th percentile over 250 round trips, in microseconds.
// Run on the device (docs/benchmarks.md):
//   nvcc -O2 -arch=sm_90 -o /tmp/launch_probe scripts/launch_probe.cu && /tmp/launch_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

constexpr int kThreads = 288;
constexpr int kSmemBytes = 220 * 1024;

// Writes `value` to out (device) and, unless null, to mapped (host memory
// the device writes through).
__global__ void __launch_bounds__(kThreads, 1) WriteOne(int* out, volatile int* mapped, int value) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) smem[blockIdx.x % 1024] = 1;  // the shared memory is used
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *out = value;
    if (mapped) {
      __threadfence_system();
      *mapped = value;
    }
  }
}

// Runs round_trip(i) 300 times and prints the times of the last 250.
template <typename RoundTrip>
void Time(const char* name, RoundTrip round_trip) {
  std::vector<double> us;
  for (int i = 1; i <= 300; ++i) {
    const auto start = std::chrono::steady_clock::now();
    round_trip(i);
    const auto end = std::chrono::steady_clock::now();
    if (i > 50) us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("%-46s median %5.1f us  p10 %5.1f  p90 %5.1f\n", name, us[us.size() / 2],
              us[us.size() / 10], us[us.size() * 9 / 10]);
}

bool Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main() {
  int sms = 0;
  cudaStream_t stream;
  int *device = nullptr, *pinned = nullptr, *mapped = nullptr, *mapped_device = nullptr;
  if (!Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SMs") ||
      !Check(
          cudaFuncSetAttribute(WriteOne, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
          "shared memory") ||
      !Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
      !Check(cudaMalloc(&device, sizeof(int)), "device int") ||
      !Check(cudaHostAlloc(&pinned, sizeof(int), cudaHostAllocDefault), "pinned int") ||
      !Check(cudaHostAlloc(&mapped, sizeof(int), cudaHostAllocMapped), "mapped int") ||
      !Check(cudaHostGetDevicePointer(&mapped_device, mapped, 0), "mapped pointer"))
    return 1;
  const auto cooperative = [&](int value, int* to_host) {
    volatile int* mapped_arg = to_host;
    void* args[] = {&device, &mapped_arg, &value};
    cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(WriteOne), dim3(sms), dim3(kThreads),
                                args, kSmemBytes, stream);
  };
  const auto plain = [&](int value, int* to_host) {
    WriteOne<<<sms, kThreads, kSmemBytes, stream>>>(device, to_host, value);
  };
  const auto read_back = [&] {
    cudaMemcpyAsync(pinned, device, sizeof(int), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
  };
  const auto spin = [&](int value) {
    while (*static_cast<volatile int*>(mapped) != value) {
    }
  };
  std::printf("%s, %d SMs\n", "launch, read one int back", sms);
  Time("cooperative launch, copy, stream sync",
       [&](int i) { cooperative(i, nullptr), read_back(); });
  Time("plain launch, copy, stream sync", [&](int i) { plain(i, nullptr), read_back(); });
  Time("cooperative launch, spin on mapped memory",
       [&](int i) { cooperative(i, mapped_device), spin(i); });
  Time("plain launch, spin on mapped memory", [&](int i) { plain(i, mapped_device), spin(i); });
  Time("cooperative launch, stream sync", [&](int i) {
    cooperative(i, nullptr);
    cudaStreamSynchronize(stream);
  });
  Time("the cooperative launch call alone", [&](int i) { cooperative(i, nullptr); });
  if (!Check(cudaStreamSynchronize(stream), "run")) return 1;
  std::printf("read back %d and %d (want 300)\n", *pinned, *mapped);
  return *pinned == 300 && *mapped == 300 ? 0 : 1;
}
