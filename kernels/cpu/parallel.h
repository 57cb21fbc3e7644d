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

#include "core/parallel.h"

namespace lair::kernels::cpu {

using ::lair::ResolveThreads;

// lair::ParallelFor (core/parallel.h) with OpenBLAS held at one thread.
void ParallelFor(int64_t count, int threads, const std::function<void(int64_t)>& body);

}  // namespace lair::kernels::cpu
