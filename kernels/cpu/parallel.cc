#include "kernels/cpu/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

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

int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

void ParallelFor(int64_t count, int threads, const std::function<void(int64_t)>& body) {
  SingleThreadedBlas blas;
  const int64_t workers = std::min<int64_t>(ResolveThreads(threads), count);
  std::atomic<int64_t> next{0};
  auto drain = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) body(i);
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(drain);
  drain();
  for (std::thread& t : pool) t.join();
}

}  // namespace lair::kernels::cpu
