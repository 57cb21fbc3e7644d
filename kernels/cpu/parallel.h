// Work splitting for the CPU kernels: a loop over independent items (one
// (sequence, head) pair each) spread over a few threads.
//
// OpenBLAS is held at one thread while the loop runs: the mixers issue many
// small matmuls from several threads at once, and letting each of them fan
// out again would oversubscribe the cores. The previous setting is restored
// afterwards.
//
// Thread safety: ParallelFor may be called from several threads; `body` must
// be safe to run concurrently for different items.
#pragma once

#include <cstdint>
#include <functional>

namespace lair::kernels::cpu {

// The number of worker threads `threads` asks for: itself when positive,
// every core otherwise.
int ResolveThreads(int threads);

// Calls body(i) once for each i in [0, count), on up to `threads` threads
// (the calling thread included), and returns when all calls have returned.
void ParallelFor(int64_t count, int threads, const std::function<void(int64_t)>& body);

}  // namespace lair::kernels::cpu
