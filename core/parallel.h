// A loop over independent items spread over the machine's cores: filling or
// converting billions of weights at load time, and the CPU kernels' loops
// over (sequence, head) pairs (kernels/cpu/parallel.h adds their BLAS rule).
//
// Thread safety: ParallelFor may be called from several threads; `body` must
// be safe to run concurrently for different items.
#pragma once

#include <cstdint>
#include <functional>

namespace lair {

// `threads` when positive, else the number of cores.
int ResolveThreads(int threads);

// Calls body(i) once for each i in [0, count), on up to `threads` threads
// (ResolveThreads; the calling thread included), and returns when all calls
// have returned.
void ParallelFor(int64_t count, int threads, const std::function<void(int64_t)>& body);

}  // namespace lair
