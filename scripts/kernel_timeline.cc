// A kernel timeline without Nsight Systems (the device machine has none): a
// CUDA injection library that records every kernel's start and end through
// CUPTI's activity API, graph replays included, and writes them as tab-
// separated lines (start ns, end ns, graph node, grid x·y·z, name) to
// $KERNEL_TIMELINE_OUT when the process exits. CUPTI reads the GPU's own
// timestamps, and the concurrent-kernel records keep programmatic launches
// overlapping. scripts/kernel_timeline.py turns the file into a per-layer
// table. Build and run on the device (docs/benchmarks.md):
//   g++ -O2 -shared -fPIC -I/usr/local/cuda/include -o /tmp/libtimeline.so
//       scripts/kernel_timeline.cc -L/usr/local/cuda/lib64 -lcupti
//   CUDA_INJECTION64_PATH=/tmp/libtimeline.so KERNEL_TIMELINE_OUT=/tmp/t.tsv
//       build/bin/lair bench decode ...
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct Record {
  uint64_t start, end, node;
  int grid;
  std::string name;
};

std::mutex records_mutex;
std::vector<Record>* records = new std::vector<Record>();  // outlives exit handlers

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records->push_back({k->start, k->end, k->graphNodeId, k->gridX * k->gridY * k->gridZ, k->name});
  }
  std::free(buffer);
}

void WriteRecords() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("KERNEL_TIMELINE_OUT");
  FILE* out = std::fopen(path ? path : "kernel_timeline.tsv", "w");
  if (out == nullptr) return;
  std::lock_guard<std::mutex> lock(records_mutex);
  for (const Record& r : *records) {
    std::fprintf(out, "%llu\t%llu\t%llu\t%d\t%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), static_cast<unsigned long long>(r.node),
                 r.grid, r.name.c_str());
  }
  std::fclose(out);
}

}  // namespace

// Called by the CUDA driver at initialization when CUDA_INJECTION64_PATH
// names this library.
extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_timeline: CUPTI refused the kernel records\n");
    return 0;
  }
  std::atexit(WriteRecords);
  return 1;
}
