#include "kernels/cpu/parallel.h"

#include <cblas.h>

namespace lair::kernels::cpu {
namespace {

// Sets OpenBLAS to one thread for its lifetime.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : previous_(openblas_get_num_threads()) {
    if (previous_ != 1) openblas_set_num_threads(1);
  }
  ~SingleThreadedBlas() {
    if (previous_ != 1) openblas_set_num_threads(previous_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  const int previous_;
};

}  // namespace

void ParallelFor(int64_t count, int threads, const std::function<void(int64_t)>& body) {
  SingleThreadedBlas blas;
  ::lair::ParallelFor(count, threads, body);
}

}  // namespace lair::kernels::cpu
