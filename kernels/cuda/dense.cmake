# lair_cuda_dense: the dense operations of kernels/dense.h on CUDA
# (kernels/cuda/dense_ops.h), included from kernels/cuda/CMakeLists.txt.
# Spills are build errors; --resource-usage prints each kernel's registers,
# shared memory and stack frame (0 everywhere but RotaryKernel's 32 bytes: the
# table of sinf/cosf's slow range reduction, taken only for |angle| > 105615).
lair_library(lair_cuda_dense STATIC
  ${CMAKE_CURRENT_LIST_DIR}/dense_ops.cc
  ${CMAKE_CURRENT_LIST_DIR}/dense_gemm.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_small_gemm.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_small_gemm_gemv.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_small_gemm_narrow_k.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_small_gemm_ring.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_norm.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_elementwise.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_conv.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_attention.cu
  ${CMAKE_CURRENT_LIST_DIR}/dense_loss.cu)
target_link_libraries(lair_cuda_dense
  PUBLIC lair_core CUDA::cudart
  PRIVATE lair_dense_checks CUDA::cublasLt absl::strings)
target_compile_options(lair_cuda_dense PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--resource-usage -Xptxas=-warn-spills
    -Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
