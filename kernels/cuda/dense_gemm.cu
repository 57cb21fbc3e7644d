// GemmRunner: row-major c = alpha·op(a)·op(b) + beta·c (+ bias) through
// cuBLASLt, for F32 activations and F32/BF16/F16 weights (GemmPrecision in
// dense_ops.h says which arithmetic); decode-sized products go to the kernels
// of dense_small_gemm.h instead.
//
// cuBLASLt is column-major; a row-major [r, c] matrix is its transpose there,
// so the runner computes cᵀ = op(b)ᵀ·op(a)ᵀ: cuBLAS's A is our b (op T when
// trans_b), its B our a (op T when trans_a), its C our c with ld n, and the
// epilogue bias (one value per cuBLAS row) is bias[j]. Plans (descriptors and
// the algorithm: the heuristic's first, or for products of many rows the
// fastest of its first few, timed) are cached per shape, types and alignment.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_launch.h"
#include "kernels/cuda/dense_small_gemm.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kThreads = 256;
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
// Exact mode widens at most this many bytes of b per column block.
constexpr size_t kWidenBudgetBytes = size_t{64} << 20;
// Column blocks start at multiples of this (256-byte aligned c and bias).
constexpr int64_t kBlockColumns = 64;
constexpr size_t kMaxPlans = 512;
// Tuning. cuBLASLt's heuristic ranks its algorithms by a model; timing its
// first kLtCandidates on the real operands found faster ones for prefill-
// sized products (H200, against the heuristic's first: GSA 1.3B's prefill
// of 4,096 tokens +4–5% tokens/s, GLA 1.3B's +3%, an 8192³ bf16 product
// +4%; docs/benchmarks.md). Products of m ≥ kTuneMinRows rows are tuned,
// once per power-of-two bucket of m (a server sees many prompt lengths),
// the bucket's choice checked against each shape of it.
constexpr int kLtCandidates = 8;
constexpr int kTuneReps = 3;
constexpr int64_t kTuneMinRows = 1024;
constexpr size_t kTuneMaxScratchBytes = size_t{256} << 20;  // the timed runs' own output

// dst[r, j] = (float) src[r·ld + j] for r < rows, j < cols (dst dense).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    WidenKernel(const T* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / cols;
    dst[i] = static_cast<float>(src[r * ld + (i - r * cols)]);
  }
}

// dst[i] = round-to-nearest-even T(src[i]), or T(silu(gate[i])·src[i]) when
// gate is not null (as BinaryOp::kSiluMul computes it).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    NarrowKernel(const float* src, const float* gate, int64_t n, T* dst) {
  AllowDependents();
  WaitForPrerequisites();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    dst[i] = T(gate ? Silu(gate[i]) * src[i] : src[i]);
  }
}

// NarrowKernel over `quads` groups of four elements (16-byte aligned src and
// gate, 8-byte aligned dst): one element per thread ran at about 60% of the
// copy bandwidth.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    NarrowQuadsKernel(const float4* src, const float4* gate, int64_t quads, uint2* dst) {
  AllowDependents();
  WaitForPrerequisites();
  for (int64_t q = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * kThreads) {
    float4 v = src[q];
    if (gate) {
      const float4 g = gate[q];
      v = make_float4(Silu(g.x) * v.x, Silu(g.y) * v.y, Silu(g.z) * v.z, Silu(g.w) * v.w);
    }
    dst[q] = PackFour<T>(v);
  }
}

// up[i] ← silu(gate[i])·up[i] over `quads` groups of four 16-bit T (fp32
// arithmetic, one rounding), in place.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SiluMulQuadsKernel(const uint2* gate, uint2* up, int64_t quads) {
  for (int64_t q = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float4 g = UnpackFour<T>(gate[q]), u = UnpackFour<T>(up[q]);
    up[q] = PackFour<T>(
        make_float4(Silu(g.x) * u.x, Silu(g.y) * u.y, Silu(g.z) * u.z, Silu(g.w) * u.w));
  }
}

// out[i] ← T(act(c[i])) for i < count, c fp32 (a 16-bit output's activation
// and rounding in one pass) or T (the activation of a 16-bit output, in
// place when out == c), four at a time when kQuads (count a multiple of 4,
// c and out aligned to four elements).
template <typename T, bool kQuads, typename In>
__global__ void __launch_bounds__(kThreads)
    ActivateRoundKernel(const In* c, Activation act, int64_t count, T* out) {
  const auto f = [&](float x) {
    return act.alpha * ApplyUnary(act.op, act.in_scale * x) + act.beta;
  };
  constexpr int kStep = kQuads ? 4 : 1;
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kStep; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads * kStep) {
    if constexpr (kQuads) {
      float4 v;
      if constexpr (std::is_same_v<In, float>) {
        v = *reinterpret_cast<const float4*>(c + i);
      } else {
        v = UnpackFour<T>(*reinterpret_cast<const uint2*>(c + i));
      }
      *reinterpret_cast<uint2*>(out + i) = PackFour<T>(make_float4(f(v.x), f(v.y), f(v.z), f(v.w)));
    } else {
      out[i] = T(f(static_cast<float>(c[i])));
    }
  }
}

// c[i, j] = (beta == 0 ? 0 : beta·c[i, j]) + bias[j] over [m, n] with row stride ldc.
__global__ void __launch_bounds__(kThreads)
    ScaleBiasKernel(float* c, int64_t ldc, int64_t m, int64_t n, float beta, const float* bias) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < m * n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / n, j = i - r * n;
    float* at = c + r * ldc + j;
    *at = (beta == 0.0f ? 0.0f : beta * *at) + (bias ? bias[j] : 0.0f);
  }
}

unsigned GridFor(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 1 << 16));
}

absl::Status LtStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuBLASLt ", std::string(what), ": ", cublasLtGetStatusString(status)));
}

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA ", std::string(what), ": ", cudaGetErrorString(err)));
}

// The largest power of two ≤ 256 dividing the address.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// One column-major cuBLASLt problem: C[rows, cols] = α·op_a(A)·op_b(B) + β·C_in (+ bias[row]),
// C_in being C unless set.
struct LtProblem {
  cudaDataType_t ab_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  bool trans_a = false, trans_b = false;
  int64_t rows = 0, cols = 0, inner = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;  // of c_type: fp32, or 16-bit without c_in or a bias pass
  cudaDataType_t c_type = CUDA_R_32F;
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* bias = nullptr;
  const float* c_in = nullptr;  // read instead of c when beta ≠ 0 (a residual), or null
};

// Whether cuBLASLt adds g's residual as its C operand: without an activation
// to apply first, and when the product does not already read c (beta = 0, as
// in a linear group). Otherwise Finish adds it after the product.
bool ResidualAsC(const GemmCall& g) {
  return g.residual != nullptr && g.act.identity() && g.beta == 0.0f;
}

// Row-major c[m, n] (+)= op(a)·op(b) as the transposed column-major problem.
LtProblem FromRowMajor(const GemmCall& g, const void* a, const void* b, int64_t n, int64_t ldb_row,
                       float* c, const float* bias, cudaDataType_t ab_type,
                       cublasComputeType_t compute) {
  LtProblem p;
  p.ab_type = ab_type;
  p.compute = compute;
  p.trans_a = g.trans_b;
  p.trans_b = g.trans_a;
  p.rows = n;
  p.cols = g.m;
  p.inner = g.k;
  p.a = b;
  p.lda = ldb_row;
  p.b = a;
  p.ldb = g.trans_a ? g.m : g.k;
  p.c = c;
  p.ldc = g.n;
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.bias = bias;
  if (ResidualAsC(g)) {
    p.beta = 1.0f;
    p.c_in = g.residual + (c - g.c);
  }
  return p;
}

using PlanKey = std::array<int64_t, 16>;

// Descriptors and algorithm of one problem shape.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // the heuristic offered an algorithm
  // The heuristic's offers, best first, until Settle has chosen among them
  // (on the first run of the shape outside a stream capture); tune_key
  // names the shape's bucket.
  std::array<cublasLtMatmulAlgo_t, kLtCandidates> candidates{};
  int candidate_count = 0;
  PlanKey tune_key{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

struct GemmRunner::Impl {
  explicit Impl(cudaStream_t s) : stream(s), scratch(s), formed(s), gated(s), outputs(s) {}
  ~Impl() {
    if (workspace) cudaFreeAsync(workspace, stream);
    if (handle) cublasLtDestroy(handle);
  }

  absl::StatusOr<Plan*> GetPlan(const LtProblem& p, bool with_bias) {
    const uint32_t align_c = std::min(Alignment(p.c), p.c_in ? Alignment(p.c_in) : 256u);
    const PlanKey key = {p.ab_type,      p.compute,      p.trans_a, p.trans_b,
                         p.rows,         p.cols,         p.inner,   p.lda,
                         p.ldb,          p.ldc,          with_bias, Alignment(p.a),
                         Alignment(p.b), Alignment(p.c), align_c,   p.c_type};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    if (plans.size() >= kMaxPlans) plans.clear();
    auto plan = std::make_unique<Plan>();
    LAIR_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescCreate(&plan->desc, p.compute, CUDA_R_32F), "desc"));
    const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LAIR_RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescSetAttribute(
                                      plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
                                  "transa"));
    LAIR_RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescSetAttribute(
                                      plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
                                  "transb"));
    if (with_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      LAIR_RETURN_IF_ERROR(
          LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &epilogue, sizeof(epilogue)),
                   "epilogue"));
    }
    // Stored shapes: op N keeps [rows, inner] / [inner, cols], op T swaps them.
    LAIR_RETURN_IF_ERROR(
        LtStatus(cublasLtMatrixLayoutCreate(&plan->a, p.ab_type, p.trans_a ? p.inner : p.rows,
                                            p.trans_a ? p.rows : p.inner, p.lda),
                 "layout a"));
    LAIR_RETURN_IF_ERROR(
        LtStatus(cublasLtMatrixLayoutCreate(&plan->b, p.ab_type, p.trans_b ? p.cols : p.inner,
                                            p.trans_b ? p.inner : p.cols, p.ldb),
                 "layout b"));
    LAIR_RETURN_IF_ERROR(LtStatus(
        cublasLtMatrixLayoutCreate(&plan->c, p.c_type, p.rows, p.cols, p.ldc), "layout c"));

    cublasLtMatmulPreference_t pref = nullptr;
    LAIR_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref), "preference"));
    const uint64_t bytes = kLtWorkspaceBytes;
    const uint32_t align_a = Alignment(p.a), align_b = Alignment(p.b), align_d = Alignment(p.c);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &align_a, sizeof(align_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &align_b, sizeof(align_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &align_c, sizeof(align_c));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &align_d, sizeof(align_d));
    std::array<cublasLtMatmulHeuristicResult_t, kLtCandidates> results{};
    const int wanted = p.cols >= kTuneMinRows ? kLtCandidates : 1;
    int count = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      // NOT_SUPPORTED means no algorithm: the plan is kept, marked not found.
      const cublasStatus_t h =
          cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                         pref, wanted, results.data(), &count);
      if (h != CUBLAS_STATUS_NOT_SUPPORTED) st = h;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    LAIR_RETURN_IF_ERROR(LtStatus(st, "heuristic"));
    plan->found = count > 0;
    if (plan->found) plan->algo = results[0].algo;
    if (count > 1) {
      for (int i = 0; i < count; ++i)
        if (results[i].state == CUBLAS_STATUS_SUCCESS)
          plan->candidates[plan->candidate_count++] = results[i].algo;
      plan->tune_key = key;
      plan->tune_key[5] = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(p.cols)));
      if (p.ldb == p.cols) plan->tune_key[8] = plan->tune_key[5];
    }
    Plan* raw = plan.get();
    plans.emplace(key, std::move(plan));
    return raw;
  }

  // Runs p, with the bias in the epilogue when it is 16-byte aligned and
  // cuBLASLt has an algorithm for it, else as a separate pass.
  absl::Status Matmul(const LtProblem& p) {
    Plan* plan = nullptr;
    bool fused_bias = false;
    if (p.bias && Alignment(p.bias) >= 16) {
      LAIR_ASSIGN_OR_RETURN(plan, GetPlan(p, true));
      fused_bias = plan->found;
    }
    if (!fused_bias) {
      if (p.bias && p.c_type != CUDA_R_32F)
        return absl::InternalError("cuBLASLt: a 16-bit output needs its bias in the epilogue");
      LAIR_ASSIGN_OR_RETURN(plan, GetPlan(p, false));
      if (!plan->found) {
        return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for a ", p.rows, "x",
                                                p.cols, "x", p.inner, " product"));
      }
    } else {
      LAIR_RETURN_IF_ERROR(
          LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &p.bias, sizeof(p.bias)),
                   "bias"));
    }
    if (plan->candidate_count > 1) Settle(plan, p);
    LAIR_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmul(handle, plan->desc, &p.alpha, p.a, plan->a, p.b, plan->b, &p.beta,
                                p.c_in ? static_cast<const void*>(p.c_in) : p.c, plan->c, p.c,
                                plan->c, &plan->algo, workspace, kLtWorkspaceBytes, stream),
                 "matmul"));
    if (p.bias && !fused_bias) {
      // Row-major view: [cols, rows] with row stride ldc.
      ScaleBiasKernel<<<GridFor(p.rows * p.cols), kThreads, 0, stream>>>(
          static_cast<float*>(p.c), p.ldc, p.cols, p.rows, 1.0f, p.bias);
      return CudaStatus(cudaGetLastError(), "bias");
    }
    return absl::OkStatus();
  }

  // p through `algo` into d instead of p.c (same layout).
  bool RunInto(const Plan& plan, const LtProblem& p, const cublasLtMatmulAlgo_t* algo, void* d) {
    const void* c = p.c_in ? static_cast<const void*>(p.c_in) : p.c;
    return cublasLtMatmul(handle, plan.desc, &p.alpha, p.a, plan.a, p.b, plan.b, &p.beta, c, plan.c,
                          d, plan.c, algo, workspace, kLtWorkspaceBytes,
                          stream) == CUBLAS_STATUS_SUCCESS;
  }

  // Chooses plan->algo among its candidates: the bucket's choice where one
  // was made and cuBLASLt takes it for this shape, else the fastest of them
  // timed on p's operands (Tune). Not while the stream is being captured
  // (the events and the wait would not run): a later run settles.
  void Settle(Plan* plan, const LtProblem& p) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return;
    }
    if (const auto it = tuned.find(plan->tune_key); it != tuned.end()) {
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                  &it->second, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= kLtWorkspaceBytes) {
        plan->algo = it->second;
      }
    } else if (Tune(plan, p)) {
      tuned[plan->tune_key] = plan->algo;
    }
    plan->candidate_count = 0;
  }

  // Times each of plan's candidates on p's operands, writing a scratch D
  // (so that C, which p may read in place, is left as it was), and keeps
  // the fastest as plan->algo. False, keeping the heuristic's first, where
  // no scratch or event is to be had.
  bool Tune(Plan* plan, const LtProblem& p) {
    const size_t bytes = static_cast<size_t>(p.ldc) * p.cols * (p.c_type == CUDA_R_32F ? 4 : 2);
    void* d = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    float best_ms = 0.0f;
    if (bytes <= kTuneMaxScratchBytes && cudaMallocAsync(&d, bytes, stream) == cudaSuccess &&
        cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
      for (int i = 0; i < plan->candidate_count; ++i) {
        const cublasLtMatmulAlgo_t* algo = &plan->candidates[i];
        if (!RunInto(*plan, p, algo, d)) continue;  // also the warm-up
        bool ok = cudaEventRecord(start, stream) == cudaSuccess;
        for (int r = 0; ok && r < kTuneReps; ++r) ok = RunInto(*plan, p, algo, d);
        float ms = 0.0f;
        ok = ok && cudaEventRecord(stop, stream) == cudaSuccess &&
             cudaEventSynchronize(stop) == cudaSuccess &&
             cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
        if (ok && (best_ms == 0.0f || ms < best_ms)) {
          best_ms = ms;
          plan->algo = *algo;
        }
      }
    }
    if (d) cudaFreeAsync(d, stream);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    (void)cudaGetLastError();
    return best_ms > 0.0f;
  }

  // F32 activations × BF16/F16 weights on tensor cores: the activations,
  // shared by every call, rounded to b's type once (normalized as they are
  // rounded when a_norm is given).
  template <typename T>
  absl::Status RunNarrowed(std::span<const GemmCall> calls, const NormParams* a_norm) {
    const GemmCall& first = calls.front();
    LAIR_ASSIGN_OR_RETURN(char* buffer,
                          scratch.Get(static_cast<size_t>(first.m * first.k) * sizeof(T)));
    T* a = reinterpret_cast<T*>(buffer);
    LAIR_RETURN_IF_ERROR(Round(first, a_norm, a));
    for (const GemmCall& g : calls) {
      LtProblem p = FromRowMajor(g, a, g.b, g.n, g.trans_b ? g.k : g.n, g.c, g.bias,
                                 CudaType(g.b_type), CUBLAS_COMPUTE_32F);
      if (WritesSixteenBitsDirectly(g)) {
        p.c = g.c16;
        p.c_type = CudaType(g.c16_type);
        LAIR_RETURN_IF_ERROR(Matmul(p));
        if (!g.act.identity()) LAIR_RETURN_IF_ERROR(ActivateInPlace(g));
        continue;
      }
      LAIR_RETURN_IF_ERROR(Matmul(p));
      if (g.c16) {
        LAIR_RETURN_IF_ERROR(ActivateRound(g, g.act));
      } else {
        LAIR_RETURN_IF_ERROR(Finish(g, /*product_ran=*/true));
      }
    }
    return absl::OkStatus();
  }

  // Whether cuBLASLt writes g's 16-bit output itself: no bias (its epilogue
  // would want a 16-bit bias). An activation then runs over that output in
  // place (ActivateInPlace), rounding twice (act of the rounded product,
  // rounded) where an fp32 scratch would round once: 2 + 2 + 2 bytes an
  // element against 4 + 4 + 2. GSA 1.3B's prefill of 4096 tokens spent
  // 1.2 ms of 27 in the fp32 passes for its swish projections (H200).
  static bool WritesSixteenBitsDirectly(const GemmCall& g) { return g.c16 && g.bias == nullptr; }

  // g.c16 ← act(g.c) rounded (g.c an fp32 scratch; no residual).
  absl::Status ActivateRound(const GemmCall& g, const Activation& act) {
    if (g.c16_type == DType::kBF16) {
      LaunchActivateRound(g.c, act, g.m * g.n, static_cast<__nv_bfloat16*>(g.c16));
    } else {
      LaunchActivateRound(g.c, act, g.m * g.n, static_cast<__half*>(g.c16));
    }
    return CudaStatus(cudaGetLastError(), "round output");
  }

  // g.c16 ← act(g.c16) rounded, in place.
  absl::Status ActivateInPlace(const GemmCall& g) {
    if (g.c16_type == DType::kBF16) {
      auto* c = static_cast<__nv_bfloat16*>(g.c16);
      LaunchActivateRound(c, g.act, g.m * g.n, c);
    } else {
      auto* c = static_cast<__half*>(g.c16);
      LaunchActivateRound(c, g.act, g.m * g.n, c);
    }
    return CudaStatus(cudaGetLastError(), "activate output");
  }

  template <typename T, typename In>
  void LaunchActivateRound(const In* c, const Activation& act, int64_t count, T* out) {
    if (count % 4 == 0 && reinterpret_cast<uintptr_t>(c) % (4 * sizeof(In)) == 0 &&
        reinterpret_cast<uintptr_t>(out) % 8 == 0) {
      ActivateRoundKernel<T, true, In>
          <<<GridFor(count / 4), kThreads, 0, stream>>>(c, act, count, out);
    } else {
      ActivateRoundKernel<T, false, In>
          <<<GridFor(count), kThreads, 0, stream>>>(c, act, count, out);
    }
  }

  // `group` with an fp32 scratch c for each 16-bit output that is not
  // written directly (`direct`: WritesSixteenBitsDirectly applies).
  absl::StatusOr<std::vector<GemmCall>> WithScratchOutputs(std::span<const GemmCall> group,
                                                           bool direct) {
    std::vector<GemmCall> out(group.begin(), group.end());
    const auto needs = [&](const GemmCall& g) {
      return g.c16 && !(direct && WritesSixteenBitsDirectly(g));
    };
    ScratchLayout layout;
    for (const GemmCall& g : group)
      if (needs(g)) layout.Add<float>(g.m * g.n);
    if (layout.bytes() == 0) return out;
    LAIR_ASSIGN_OR_RETURN(char* cursor, outputs.Get(layout.bytes()));
    for (GemmCall& g : out)
      if (needs(g)) g.c = ScratchLayout::Take<float>(&cursor, g.m * g.n);
    return out;
  }

  // calls[0..1] (gate, up) into 16-bit [m, f] outputs, then calls[2] (down)
  // reading silu(gate) ∘ up formed over up.
  template <typename T>
  absl::Status RunSwiGluIn(std::span<const GemmCall, 3> calls, const NormParams* a_norm) {
    const GemmCall &gate = calls[0], &down = calls[2];
    ScratchLayout layout;
    layout.Add<T>(gate.m * gate.k);
    layout.Add<T>(gate.m * gate.n);
    layout.Add<T>(gate.m * gate.n);
    LAIR_ASSIGN_OR_RETURN(char* cursor, scratch.Get(layout.bytes()));
    T* a = ScratchLayout::Take<T>(&cursor, gate.m * gate.k);
    T* projections[2] = {ScratchLayout::Take<T>(&cursor, gate.m * gate.n),
                         ScratchLayout::Take<T>(&cursor, gate.m * gate.n)};
    LAIR_RETURN_IF_ERROR(Round(gate, a_norm, a));
    for (int i = 0; i < 2; ++i) {
      const GemmCall& g = calls[i];
      LtProblem p = FromRowMajor(g, a, g.b, g.n, g.k, nullptr, nullptr, CudaType(g.b_type),
                                 CUBLAS_COMPUTE_32F);
      p.c = projections[i];
      p.c_type = CudaType(g.b_type);
      LAIR_RETURN_IF_ERROR(Matmul(p));
    }
    const int64_t quads = gate.m * gate.n / 4;
    SiluMulQuadsKernel<T>
        <<<GridFor(quads), kThreads, 0, stream>>>(reinterpret_cast<const uint2*>(projections[0]),
                                                  reinterpret_cast<uint2*>(projections[1]), quads);
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "silu gate"));
    LAIR_RETURN_IF_ERROR(
        Matmul(FromRowMajor(down, projections[1], down.b, down.n, down.k, down.c, down.bias,
                            CudaType(down.b_type), CUBLAS_COMPUTE_32F)));
    return Finish(down, /*product_ran=*/true);
  }

  // a ← first's activations rounded to T (normalized first with a_norm, or
  // silu(a_gate) ∘ a).
  template <typename T>
  absl::Status Round(const GemmCall& first, const NormParams* a_norm, T* a) {
    const int64_t count = first.m * first.k;
    if (a_norm) {
      NormParams p = *a_norm;
      p.y = a;
      p.y_type = std::is_same_v<T, __half> ? DType::kF16 : DType::kBF16;
      LAIR_RETURN_IF_ERROR(CudaStatus(LaunchNorm(p, stream), "input norm"));
    } else if (count % 4 == 0 && Aligned16(first.a) && Aligned16(first.a_gate)) {
      LAIR_RETURN_IF_ERROR(
          CudaStatus(LaunchDependent(NarrowQuadsKernel<T>, GridFor(count / 4), kThreads, stream,
                                     reinterpret_cast<const float4*>(first.a),
                                     reinterpret_cast<const float4*>(first.a_gate), count / 4,
                                     reinterpret_cast<uint2*>(a)),
                     "narrow"));
    } else {
      LAIR_RETURN_IF_ERROR(CudaStatus(LaunchDependent(NarrowKernel<T>, GridFor(count), kThreads,
                                                      stream, first.a, first.a_gate, count, a),
                                      "narrow"));
    }
    return absl::OkStatus();
  }

  // `group` (ReadsRoundedActivations) reading the norm of their shared a,
  // or silu(a_gate) ∘ a, formed in the `formed` scratch by one pass that
  // writes it rounded to the weights' (16-bit) type.
  absl::StatusOr<std::vector<GemmCall>> FormRounded(std::span<const GemmCall> group,
                                                    const NormParams* a_norm) {
    std::vector<GemmCall> out(group.begin(), group.end());
    const GemmCall& first = group.front();
    LAIR_ASSIGN_OR_RETURN(char* buffer, formed.Get(static_cast<size_t>(first.m * first.k) * 2));
    LAIR_RETURN_IF_ERROR(first.b_type == DType::kBF16
                             ? Round(first, a_norm, reinterpret_cast<__nv_bfloat16*>(buffer))
                             : Round(first, a_norm, reinterpret_cast<__half*>(buffer)));
    for (GemmCall& g : out) {
      g.a = nullptr;
      g.a_gate = nullptr;
      g.a_rounded = buffer;
    }
    return out;
  }

  // `group` reading the norm of their shared a, formed in the `formed`
  // scratch by one norm pass.
  absl::StatusOr<std::vector<GemmCall>> FormNormed(std::span<const GemmCall> group,
                                                   const NormParams& a_norm) {
    std::vector<GemmCall> out(group.begin(), group.end());
    const GemmCall& first = group.front();
    LAIR_ASSIGN_OR_RETURN(char* buffer,
                          formed.Get(static_cast<size_t>(first.m * first.k) * sizeof(float)));
    NormParams p = a_norm;
    p.y = buffer;
    p.y_type = DType::kF32;
    LAIR_RETURN_IF_ERROR(CudaStatus(LaunchNorm(p, stream), "input norm"));
    for (GemmCall& g : out) g.a = reinterpret_cast<const float*>(buffer);
    return out;
  }

  // `group` reading silu(a_gate) ∘ a, formed in the `formed` scratch by an
  // elementwise pass (one for consecutive calls that share a and a_gate, as
  // a LinearGroup's members do).
  absl::StatusOr<std::vector<GemmCall>> FormGated(std::span<const GemmCall> group) {
    // Member i reuses member i − 1's formed input when they share a and a_gate.
    const auto shares_previous = [&](size_t i) {
      return i > 0 && group[i - 1].a == group[i].a && group[i - 1].a_gate == group[i].a_gate;
    };
    std::vector<GemmCall> out(group.begin(), group.end());
    size_t bytes = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      if (group[i].a_gate && !shares_previous(i))
        bytes += static_cast<size_t>(group[i].m * group[i].k) * sizeof(float);
    }
    LAIR_ASSIGN_OR_RETURN(char* buffer, formed.Get(bytes));
    float* next = reinterpret_cast<float*>(buffer);
    for (size_t i = 0; i < out.size(); ++i) {
      GemmCall& g = out[i];
      if (!g.a_gate) continue;
      if (shares_previous(i)) {
        g.a = out[i - 1].a;
      } else {
        BinaryParams p;
        p.op = BinaryOp::kSiluMul;
        p.a = g.a_gate;
        p.b = g.a;
        p.y = next;
        p.count = g.m * g.k;
        LAIR_RETURN_IF_ERROR(CudaStatus(LaunchBinary(p, stream), "silu gate"));
        g.a = next;
        next += p.count;
      }
      g.a_gate = nullptr;
    }
    return out;
  }

  // g.c ← g.act(g.c) + g.residual in elementwise passes, after a product
  // that has no epilogue for them (the small products apply them). A cuBLASLt
  // product that ran has added the residual when ResidualAsC; one that did
  // not run (k = 0) has not.
  absl::Status Finish(const GemmCall& g, bool product_ran) {
    if (g.m == 0 || g.n == 0) return absl::OkStatus();
    if (!g.act.identity()) {
      UnaryParams p;
      p.op = g.act.op;
      p.alpha = g.act.alpha;
      p.beta = g.act.beta;
      p.in_scale = g.act.in_scale;
      p.x = g.c;
      p.y = g.c;
      p.count = g.m * g.n;
      LAIR_RETURN_IF_ERROR(CudaStatus(LaunchUnary(p, stream), "activation"));
    }
    if (g.residual && !(product_ran && ResidualAsC(g))) {
      BinaryParams p;
      p.a = g.c;
      p.b = g.residual;
      p.y = g.c;
      p.count = g.m * g.n;
      LAIR_RETURN_IF_ERROR(CudaStatus(LaunchBinary(p, stream), "residual"));
    }
    return absl::OkStatus();
  }

  // F32 activations × BF16/F16 weights in fp32: b widened per column block.
  template <typename T>
  absl::Status RunWidened(const GemmCall& g) {
    int64_t block = static_cast<int64_t>(kWidenBudgetBytes / (sizeof(float) * g.k));
    block = std::max<int64_t>(kBlockColumns, block / kBlockColumns * kBlockColumns);
    block = std::min(block, g.n);
    LAIR_ASSIGN_OR_RETURN(char* buffer,
                          scratch.Get(static_cast<size_t>(block * g.k) * sizeof(float)));
    float* wide = reinterpret_cast<float*>(buffer);
    const T* b = static_cast<const T*>(g.b);
    for (int64_t n0 = 0; n0 < g.n; n0 += block) {
      const int64_t cols = std::min(block, g.n - n0);
      // trans_b: rows [n0, n0 + cols) of b [n, k]; else columns of b [k, n].
      if (g.trans_b) {
        WidenKernel<T>
            <<<GridFor(cols * g.k), kThreads, 0, stream>>>(b + n0 * g.k, g.k, cols, g.k, wide);
      } else {
        WidenKernel<T><<<GridFor(cols * g.k), kThreads, 0, stream>>>(b + n0, g.n, g.k, cols, wide);
      }
      LAIR_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "widen"));
      LAIR_RETURN_IF_ERROR(
          Matmul(FromRowMajor(g, g.a, wide, cols, g.trans_b ? g.k : cols, g.c + n0,
                              g.bias ? g.bias + n0 : nullptr, CUDA_R_32F, CUBLAS_COMPUTE_32F)));
    }
    return absl::OkStatus();
  }

  cudaStream_t stream;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  DeviceScratch scratch;  // narrowed activations or widened weight blocks
  DeviceScratch formed;   // silu(a_gate) ∘ a or a's norm, for products that do not form it
  DeviceScratch gated;    // silu(gate) ∘ up from a paired GEMV, for the down product
  DeviceScratch outputs;  // fp32 outputs of the calls that write 16 bits after a pass
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::map<PlanKey, cublasLtMatmulAlgo_t> tuned;  // Tune's choices by Plan::tune_key
};

namespace {

// Whether the decode GEMV forms `norm` of the group's a itself
// (GemmCall::a_rms): an RMS norm over whole fp32 rows, without weight or
// gate, as a block norm is once its weight is folded into the products'.
bool GemvFormsNorm(const NormParams& norm, const GemmCall& first) {
  return norm.kind == NormKind::kRms && norm.gate_mode == NormGate::kNone &&
         norm.weight == nullptr && norm.group == norm.cols && norm.x_type == DType::kF32 &&
         norm.x == first.a && first.a != nullptr && first.m <= kGemvNormMaxRows;
}

std::vector<GemmCall> WithRowRms(std::span<const GemmCall> group, float eps) {
  std::vector<GemmCall> out(group.begin(), group.end());
  for (GemmCall& g : out) {
    g.a_rms = true;
    g.a_rms_eps = eps;
  }
  return out;
}

}  // namespace

GemmRunner::GemmRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmRunner::~GemmRunner() = default;

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(cudaStream_t stream) {
  auto impl = std::make_unique<Impl>(stream);
  LAIR_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&impl->handle), "create"));
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaMallocAsync(&impl->workspace, kLtWorkspaceBytes, stream), "workspace"));
  return std::unique_ptr<GemmRunner>(new GemmRunner(std::move(impl)));
}

absl::Status GemmRunner::Run(const GemmCall& g, GemmPrecision precision) {
  return RunGroup({&g, 1}, precision);
}

absl::Status GemmRunner::RunGroup(std::span<const GemmCall> group, GemmPrecision precision,
                                  const NormParams* a_norm) {
  Impl& im = *impl_;
  if (group.empty()) return absl::OkStatus();
  // Decode-sized products stream the 16-bit weights once, the whole group in
  // one launch. Products sharing activations and a 16-bit weight type share
  // one rounding of the activations on the fast path.
  const SmallProduct kind = SmallProductFor(group, precision);
  const GemmCall& first = group.front();
  bool shared_narrow = kind == SmallProduct::kNone && precision == GemmPrecision::kFast &&
                       first.m > 0 && first.k > 0;
  for (const GemmCall& g : group) {
    shared_narrow &= g.a == first.a && g.a_gate == first.a_gate && g.m == first.m &&
                     g.k == first.k && !g.trans_a && g.b_type == first.b_type && g.n > 0 &&
                     IsSixteenBitFloat(g.b_type);
  }
  // Gated or normalized activations: the rounding pass forms silu(a_gate) ∘
  // a or the norm as it reads a (a prefill's SwiGLU and block norms cost no
  // pass of their own); the other paths read it formed here. (Forming it in
  // the decode ring kernel as it stages the activations measured no faster
  // than this pass: docs/benchmarks.md.)
  std::vector<GemmCall> formed;
  if ((first.a_gate == nullptr) != (a_norm == nullptr) &&
      ReadsRoundedActivations(group, precision)) {
    // The ring kernel copies them into its stages as they come.
    LAIR_ASSIGN_OR_RETURN(formed, im.FormRounded(group, a_norm));
    group = formed;
  } else if (first.a_gate && !shared_narrow) {
    LAIR_ASSIGN_OR_RETURN(formed, im.FormGated(group));
    group = formed;
  } else if (a_norm && kind == SmallProduct::kGemv && GemvFormsNorm(*a_norm, first)) {
    formed = WithRowRms(group, a_norm->eps);
    group = formed;
  } else if (a_norm && !shared_narrow) {
    LAIR_ASSIGN_OR_RETURN(formed, im.FormNormed(group, *a_norm));
    group = formed;
  }
  // 16-bit outputs (GemmCall::c16): cuBLASLt writes them after the shared
  // rounding, or an fp32 scratch takes the output and one pass rounds it.
  std::vector<GemmCall> widened;
  const bool direct = kind == SmallProduct::kNone && shared_narrow;
  LAIR_ASSIGN_OR_RETURN(widened, im.WithScratchOutputs(group, direct));
  group = widened;
  if (direct) {
    return first.b_type == DType::kBF16 ? im.RunNarrowed<__nv_bfloat16>(group, a_norm)
                                        : im.RunNarrowed<__half>(group, a_norm);
  }
  if (kind != SmallProduct::kNone) {
    LAIR_RETURN_IF_ERROR(CudaStatus(LaunchSmallProduct(kind, group, im.stream), "small product"));
  } else {
    for (const GemmCall& g : group) LAIR_RETURN_IF_ERROR(RunOne(g, precision));
  }
  for (const GemmCall& g : group) {
    if (g.c16) LAIR_RETURN_IF_ERROR(im.ActivateRound(g, Activation{}));
  }
  return absl::OkStatus();
}

bool GemmRunner::TakesSwiGlu(std::span<const GemmCall, 3> calls, GemmPrecision precision) {
  const GemmCall &gate = calls[0], &up = calls[1], &down = calls[2];
  const DType type = gate.b_type;
  if (!IsSixteenBitFloat(type) || up.b_type != type || down.b_type != type || gate.m <= 0 ||
      gate.k <= 0 || gate.n <= 0 || up.n != gate.n || down.k != gate.n) {
    return false;
  }
  if (TakesSiluPair(calls.first<2>(), precision)) {
    // The ring kernel's pair hands down its output rounded: down must read it so.
    return !ReadsRoundedActivations(calls.first<2>(), precision) ||
           ReadsRoundedActivations(calls.last<1>(), precision);
  }
  return precision == GemmPrecision::kFast && gate.n % 4 == 0 &&
         SmallProductFor(calls.first<2>(), precision) == SmallProduct::kNone &&
         SmallProductFor(calls.last<1>(), precision) == SmallProduct::kNone;
}

absl::Status GemmRunner::RunSwiGlu(std::span<const GemmCall, 3> calls, GemmPrecision precision,
                                   const NormParams* a_norm) {
  Impl& im = *impl_;
  if (!TakesSiluPair(calls.first<2>(), precision)) {
    return calls[0].b_type == DType::kBF16 ? im.RunSwiGluIn<__nv_bfloat16>(calls, a_norm)
                                           : im.RunSwiGluIn<__half>(calls, a_norm);
  }
  std::vector<GemmCall> gate_up(calls.begin(), calls.begin() + 2);
  // The ring kernel's rows: its input and its output rounded to the weights' type.
  const SmallProduct kind = SmallProductFor(calls.first<2>(), precision);
  const bool rounded = kind == SmallProduct::kTensorCore;
  if (a_norm && rounded) {
    LAIR_ASSIGN_OR_RETURN(gate_up, im.FormRounded(gate_up, a_norm));
  } else if (a_norm && GemvFormsNorm(*a_norm, gate_up.front())) {
    gate_up = WithRowRms(gate_up, a_norm->eps);
  } else if (a_norm) {
    LAIR_ASSIGN_OR_RETURN(gate_up, im.FormNormed(gate_up, *a_norm));
  }
  const GemmCall& gate = gate_up.front();
  const size_t element = rounded ? 2 : sizeof(float);
  LAIR_ASSIGN_OR_RETURN(char* hidden, im.gated.Get(static_cast<size_t>(gate.m * gate.n) * element));
  LAIR_RETURN_IF_ERROR(CudaStatus(
      LaunchSiluPair(kind, std::span<const GemmCall, 2>(gate_up.data(), 2), hidden, im.stream),
      "silu pair"));
  GemmCall down = calls[2];
  if (rounded) {
    down.a_rounded = hidden;
  } else {
    down.a = reinterpret_cast<const float*>(hidden);
  }
  return RunGroup({&down, 1}, precision);
}

absl::Status GemmRunner::RunOne(const GemmCall& g, GemmPrecision precision) {
  Impl& im = *impl_;
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  if (g.k == 0) {
    ScaleBiasKernel<<<GridFor(g.m * g.n), kThreads, 0, im.stream>>>(g.c, g.n, g.m, g.n, g.beta,
                                                                    g.bias);
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "gemm k = 0"));
    return im.Finish(g, /*product_ran=*/false);
  }
  const bool fast = precision == GemmPrecision::kFast;
  if (const SmallProduct kind = SmallProductFor({&g, 1}, precision); kind != SmallProduct::kNone)
    return CudaStatus(LaunchSmallProduct(kind, {&g, 1}, im.stream), "small product");
  switch (g.b_type) {
    case DType::kBF16:
      if (fast) return im.RunNarrowed<__nv_bfloat16>({&g, 1}, nullptr);
      LAIR_RETURN_IF_ERROR(im.RunWidened<__nv_bfloat16>(g));
      break;
    case DType::kF16:
      if (fast) return im.RunNarrowed<__half>({&g, 1}, nullptr);
      LAIR_RETURN_IF_ERROR(im.RunWidened<__half>(g));
      break;
    default:
      LAIR_RETURN_IF_ERROR(
          im.Matmul(FromRowMajor(g, g.a, g.b, g.n, g.trans_b ? g.k : g.n, g.c, g.bias, CUDA_R_32F,
                                 fast ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F)));
  }
  return im.Finish(g, /*product_ran=*/true);
}

}  // namespace lair::kernels::cuda::dense
