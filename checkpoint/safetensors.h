// Reading and writing Hugging Face safetensors checkpoints.
//
// File format: an 8-byte little-endian header length N, N bytes of JSON
// mapping each tensor name to {dtype, shape, data_offsets: [begin, end)}
// (offsets relative to the byte after the header), an optional
// "__metadata__" map of strings, then the data.
//
// Files are memory-mapped read-only; tensors returned by Get() alias the
// mapping and keep it alive, so no copy is made for F32 weights.
//
// Every malformed input (short file, header length past the end, bad JSON,
// unknown dtype, offsets that overlap, leave gaps or run past the end, a shape
// whose byte count disagrees with its offsets) is an InvalidArgument or
// DataLoss status naming the file and tensor, never a crash.
//
// Thread safety: a SafetensorsFile and a Checkpoint are immutable after
// Open and may be shared between threads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace lair {

struct TensorInfo {
  DType dtype;
  Shape shape;
  size_t begin = 0;  // byte offset of the data, relative to the data section
  size_t end = 0;    // one past the last byte
};

// The parsed header of one safetensors file.
struct SafetensorsHeader {
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  size_t data_offset = 0;  // 8 + header length: where the data section starts
};

// Parses and validates the header of a file whose bytes start with `bytes`
// and whose total size is `file_size` (bytes may hold just the prefix that
// contains the header). `origin` names the file in error messages.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view bytes, size_t file_size,
                                                         std::string_view origin);

class SafetensorsFile {
 public:
  // Maps `path` and parses its header.
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  bool Contains(std::string_view name) const;
  // A host tensor aliasing the mapping (any stored dtype; read-only memory).
  // A file whose data is misaligned for its dtype, which safetensors' own
  // writer never produces, gets an aligned copy. NotFound when absent.
  absl::StatusOr<Tensor> Get(std::string_view name) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  SafetensorsHeader header_;
  void* mapping_ = nullptr;  // owned; unmapped in the destructor
  size_t mapping_size_ = 0;
  std::weak_ptr<const SafetensorsFile> self_;  // lets Get() hand out owners
};

// The weights of a model directory: `model.safetensors`, or the shards that
// `model.safetensors.index.json` lists (its "weight_map").
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  bool Contains(std::string_view name) const;
  // NotFound naming the tensor and the directory when absent.
  absl::StatusOr<Tensor> Get(std::string_view name) const;
  // Get() as a host float32 tensor, checked against `shape`: F32 data aliases
  // the mapping (read-only), BF16 and F16 are converted into a new tensor.
  // InvalidArgument naming the tensor for another dtype or shape.
  absl::StatusOr<Tensor> GetF32(std::string_view name, const Shape& shape) const;

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<const SafetensorsFile>, std::less<>> by_name_;
};

// Writes `tensors` (host tensors, any dtype) to `path` in safetensors format,
// in the given order, with optional string metadata.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace lair
