// Can a persistent kernel be cooperative and clustered at once (CTAs of a
// cluster sharing shared memory), one CTA per SM at 200 KB of shared memory?
// For cluster sizes 2 and 4: how many clusters fit at once, and a kernel of
// that many that swaps a value within each pair through distributed shared
// memory and meets at a grid barrier (a counter) 1,000 times, launched
// plainly and cooperatively. Prints the clusters, the CTAs, whether the pairs
// read what their partners wrote, and the time a round.
// Run on the device (docs/benchmarks.md):
//   nvcc -O2 -arch=sm_90 -o /tmp/cluster_probe scripts/cluster_probe.cu && /tmp/cluster_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

namespace cg = cooperative_groups;

__global__ void __launch_bounds__(288, 1) Pair(unsigned* arrivals, int rounds, int* bad) {
  extern __shared__ float smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  for (int r = 0; r < rounds; ++r) {
    // Each CTA writes a value, the pair reads the other's through DSMEM.
    if (threadIdx.x == 0) smem[0] = static_cast<float>(blockIdx.x * 1000 + r);
    cluster.sync();
    const float* other = cluster.map_shared_rank(smem, rank ^ 1u);
    const unsigned partner = blockIdx.x ^ 1u;
    if (threadIdx.x == 0 && other[0] != static_cast<float>(partner * 1000 + r)) atomicAdd(bad, 1);
    cluster.sync();
    // A grid barrier by a counter.
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(arrivals) : "memory");
      const unsigned target = (r + 1) * gridDim.x;
      unsigned v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(arrivals) : "memory");
      } while (v < target);
    }
    __syncthreads();
  }
}

int main() {
  int dev = 0, sms = 0, coop = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
  const int smem = 200 * 1024;
  cudaFuncSetAttribute(Pair, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(Pair, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int size : {2, 4}) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = size, attrs[0].val.clusterDim.y = 1, attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeCooperative;
    attrs[1].val.cooperative = 1;
    config.blockDim = dim3(288);
    config.dynamicSmemBytes = smem;
    config.attrs = attrs;
    config.numAttrs = 1;
    config.gridDim = dim3(sms / size * size);
    int clusters = 0;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, (void*)Pair, &config);
    std::printf("cluster %d: max active clusters %d (%s) -> %d CTAs of %d SMs\n", size, clusters,
                cudaGetErrorString(e), clusters * size, sms);
    if (clusters == 0) continue;
    config.gridDim = dim3(clusters * size);
    unsigned* arrivals;
    int* bad;
    cudaMalloc(&arrivals, 4);
    cudaMalloc(&bad, 4);
    for (int cooperative : {0, 1}) {
      config.numAttrs = 1 + cooperative;
      cudaMemset(arrivals, 0, 4);
      cudaMemset(bad, 0, 4);
      const int rounds = 1000;
      auto start = std::chrono::steady_clock::now();
      e = cudaLaunchKernelEx(&config, Pair, arrivals, rounds, bad);
      cudaError_t s = cudaDeviceSynchronize();
      auto end = std::chrono::steady_clock::now();
      int host_bad = -1;
      cudaMemcpy(&host_bad, bad, 4, cudaMemcpyDeviceToHost);
      std::printf(
          "  cooperative %d: launch %s, run %s, bad %d, %.2f us a round (2 cluster syncs + grid "
          "barrier)\n",
          cooperative, cudaGetErrorString(e), cudaGetErrorString(s), host_bad,
          std::chrono::duration<double, std::micro>(end - start).count() / rounds);
    }
    cudaFree(arrivals);
    cudaFree(bad);
  }
  std::printf("cooperative launch attribute: %d\n", coop);
}
