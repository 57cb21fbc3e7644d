// Decode-sized products: c[i, j] = act(alpha·Σ_k a[i, k]·w[j, k] + beta·c[i, j]
// + bias[j]) + residual[i, j] for a handful of activation rows i, fp32
// activations and 16-bit weights w [n, k]. Memory-bound on w: every kernel
// keeps many 16-byte weight loads in flight and reads each weight once.
// This file routes a group of products to a kernel (dense_small_gemm_gemv.cu,
// _narrow_k.cu, _ring.cu) and cuts tensor-core products into CTAs and k
// splits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/dense_small_gemm.h"
#include "kernels/cuda/dense_small_gemm_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense {
namespace small_product {
namespace {

// Clusters of `size` CTAs (along y) of `kernel`, with `threads` threads and
// `shared_bytes` of dynamic shared memory each, that run at once. Clusters
// pack into GPCs with SM slots to spare: on an H100 a tensor-core kernel
// (since removed) at two CTAs per SM ran 264 CTAs alone but 237 in clusters
// of 3 and 240 in clusters of 8 (Nsight Compute), so grids cut for 264
// CTAs took two waves.
// (Per device: a process may drive GPUs of different kinds.)
int ActiveClusters(const void* kernel, int threads, size_t shared_bytes, int size) {
  using Key = std::tuple<int, const void*, int, size_t, int>;
  static std::mutex mu;
  static auto* known = new std::map<Key, int>();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const std::lock_guard<std::mutex> lock(mu);
  const Key key{device, kernel, threads, shared_bytes, size};
  if (const auto it = known->find(key); it != known->end()) return it->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1, static_cast<unsigned>(size));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = static_cast<unsigned>(size);
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (size == 1) {  // no cluster: CTAs per SM times SMs
    int sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&clusters, kernel, threads, shared_bytes) ==
            cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) {
      clusters *= sms;
    } else {
      (void)cudaGetLastError();
      clusters = 0;
    }
  } else if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  return (*known)[key] = clusters;
}

}  // namespace

MmaShape ShapeFor(const void* kernel, int threads, int64_t ctas, int64_t steps,
                  int64_t overhead_steps, size_t (*shared_bytes)(int64_t)) {
  MmaShape best;
  int64_t best_cost = 0;
  for (int64_t splits = 1; splits <= std::min<int64_t>(kMmaMaxSplits, steps); ++splits) {
    const int64_t per_split = (steps + splits - 1) / splits;
    if ((steps + per_split - 1) / per_split != splits) continue;  // a smaller count's cut
    const size_t bytes = shared_bytes(per_split);
    const int clusters =
        bytes == 0 ? 0 : ActiveClusters(kernel, threads, bytes, static_cast<int>(splits));
    if (clusters <= 0) continue;
    const int64_t cost = (ctas + clusters - 1) / clusters * (per_split + overhead_steps);
    if (best.splits == 0 || cost < best_cost) {
      best = {ctas, splits, per_split};
      best_cost = cost;
    }
  }
  return best;
}

namespace {

template <typename T>
SmallGroup<T> GroupOf(std::span<const GemmCall> calls) {
  SmallGroup<T> g;
  const GemmCall& first = calls.front();
  g.a = first.a;
  g.a16 = static_cast<const T*>(first.a_rounded);
  g.m = first.m;
  g.k = first.k;
  g.alpha = first.alpha;
  g.beta = first.beta;
  g.count = static_cast<int>(calls.size());
  g.row_rms = first.a_rms;
  g.rms_eps = first.a_rms_eps;
  for (int i = 0; i < g.count; ++i) {
    g.first_row[i + 1] = g.first_row[i] + calls[i].n;
    g.first_tile[i + 1] = g.first_tile[i] + TilesOf(calls[i].n);
    g.w[i] = static_cast<const T*>(calls[i].b);
    g.bias[i] = calls[i].bias;
    g.c[i] = calls[i].c;
    g.act[i] = calls[i].act;
    g.residual[i] = calls[i].residual;
  }
  return g;
}

template <typename T>
cudaError_t LaunchGroup(SmallProduct kind, std::span<const GemmCall> calls, cudaStream_t stream) {
  const SmallGroup<T> g = GroupOf<T>(calls);
  if (kind == SmallProduct::kGemv) return LaunchGemv(g, stream);
  if (kind == SmallProduct::kNarrowK) return LaunchNarrowK(g, stream);
  return LaunchPipeMma(g, stream);
}

template <typename T>
cudaError_t LaunchPair(SmallProduct kind, std::span<const GemmCall, 2> gate_up, void* out,
                       cudaStream_t stream) {
  SmallGroup<T> g = GroupOf<T>(gate_up);
  g.silu_pair = true;
  g.c[0] = g.c[1] = nullptr;
  if (kind == SmallProduct::kTensorCore) {
    g.silu_pair16 = static_cast<T*>(out);
    return LaunchPipeMma(g, stream);
  }
  g.c[0] = static_cast<float*>(out);
  return LaunchGemv(g, stream);
}

}  // namespace
}  // namespace small_product

using small_product::kGemvFastMaxRows;
using small_product::kGemvMaxRows;
using small_product::kMembers;
using small_product::kNarrowK;
using small_product::kNarrowKMaxRows;
using small_product::kPipeRows;

SmallProduct SmallProductFor(std::span<const GemmCall> calls, GemmPrecision precision) {
  if (calls.empty() || calls.size() > kMembers) return SmallProduct::kNone;
  const GemmCall& first = calls.front();
  for (const GemmCall& g : calls) {
    if ((g.b_type != DType::kBF16 && g.b_type != DType::kF16) || g.trans_a || !g.trans_b ||
        g.m == 0 || g.n == 0 || g.k == 0 || g.k % 8 != 0 || !Aligned16(g.a) || !Aligned16(g.b) ||
        g.a != first.a || g.a_gate != first.a_gate || g.m != first.m || g.k != first.k ||
        g.b_type != first.b_type || g.alpha != first.alpha || g.beta != first.beta ||
        g.a_rms != first.a_rms || g.a_rms_eps != first.a_rms_eps) {
      return SmallProduct::kNone;
    }
  }
  const bool fast = precision == GemmPrecision::kFast;
  if (first.a_rms) {  // only the GEMV forms the norm, up to kGemvNormMaxRows
    return first.m <= kGemvNormMaxRows ? SmallProduct::kGemv : SmallProduct::kNone;
  }
  if (first.m <= (fast ? kGemvFastMaxRows : kGemvMaxRows)) return SmallProduct::kGemv;
  if (first.k <= kNarrowK && first.m <= kNarrowKMaxRows) return SmallProduct::kNarrowK;
  // Clusters and the dependent launch's wait need sm_90.
  if (fast && first.m <= kPipeRows && HopperOrLater()) return SmallProduct::kTensorCore;
  return SmallProduct::kNone;
}

bool ReadsRoundedActivations(std::span<const GemmCall> calls, GemmPrecision precision) {
  return SmallProductFor(calls, precision) == SmallProduct::kTensorCore;
}

cudaError_t LaunchSmallProduct(SmallProduct kind, std::span<const GemmCall> calls,
                               cudaStream_t stream) {
  return calls.front().b_type == DType::kBF16
             ? small_product::LaunchGroup<__nv_bfloat16>(kind, calls, stream)
             : small_product::LaunchGroup<__half>(kind, calls, stream);
}

bool TakesSiluPair(std::span<const GemmCall, 2> gate_up, GemmPrecision precision) {
  const SmallProduct kind = SmallProductFor(gate_up, precision);
  if (kind != SmallProduct::kGemv && kind != SmallProduct::kTensorCore) return false;
  const GemmCall& gate = gate_up[0];
  for (const GemmCall& g : gate_up) {
    if (g.n != gate.n || g.bias || !g.act.identity() || g.residual || g.c16 || g.a_gate ||
        g.alpha != 1.0f || g.beta != 0.0f) {
      return false;
    }
  }
  return true;
}

cudaError_t LaunchSiluPair(SmallProduct kind, std::span<const GemmCall, 2> gate_up, void* out,
                           cudaStream_t stream) {
  return gate_up[0].b_type == DType::kBF16
             ? small_product::LaunchPair<__nv_bfloat16>(kind, gate_up, out, stream)
             : small_product::LaunchPair<__half>(kind, gate_up, out, stream);
}

}  // namespace lair::kernels::cuda::dense
