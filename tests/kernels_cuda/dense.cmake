# CudaDenseOps against the CPU reference; included from this folder's
# CMakeLists.txt inside its if(LAIR_HAVE_CUDA).
lair_test(kernels_cuda_dense_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/dense_cuda_test.cc
          LIBS lair_kernels lair_cuda_dense)
