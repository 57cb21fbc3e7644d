// libFuzzer target for ParseSafetensorsHeader: any bytes must give a header
// or an error status, never a crash or undefined behaviour, and a header it
// accepts must describe tensors that really fit the file, packed end to end.
//
// Build and run: scripts/fuzz-safetensors.sh [seconds].
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"

namespace {

// Aborts, so libFuzzer saves the input, unless `header` fits a file of `file_size` bytes.
void CheckAccepted(const lair::SafetensorsHeader& header, size_t file_size) {
  auto require = [](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "accepted header breaks an invariant: %s\n", what);
      std::abort();
    }
  };
  require(header.data_offset >= 8 && header.data_offset <= file_size, "data_offset in the file");
  const size_t data_size = file_size - header.data_offset;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, info] : header.tensors) {
    require(info.begin <= info.end && info.end <= data_size, "offsets inside the data section");
    require(lair::ShapeNumel(info.shape) >= 0, "non-negative element count");
    require(info.end - info.begin ==
                static_cast<size_t>(lair::ShapeNumel(info.shape)) * lair::DTypeSize(info.dtype),
            "byte count matches the shape");
    ranges.emplace_back(info.begin, info.end);
  }
  std::sort(ranges.begin(), ranges.end());
  size_t expected = 0;
  for (const auto& [begin, end] : ranges) {
    require(begin == expected, "tensors packed without gaps or overlaps");
    expected = end;
  }
  require(expected == data_size, "tensors cover the data section");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The bytes as a whole file, and as the prefix of a longer one.
  for (size_t file_size : {size, size + 4096}) {
    auto header = lair::ParseSafetensorsHeader(bytes, file_size, "fuzz");
    if (header.ok()) CheckAccepted(*header, file_size);
  }
  return 0;
}
