#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "checkpoint/config_reader.h"
#include "checkpoint/internal.h"
#include "nlohmann/json.hpp"

namespace lair {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

using checkpoint_internal::DescribeJson;
using checkpoint_internal::JsonSnippet;
using checkpoint_internal::Sv;
using Json = nlohmann::json;

// safetensors' own limit: a header over 100 MB is not a checkpoint.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

std::optional<DType> DTypeFromName(std::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64}) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

// Parses `text` into `*out`. On the way it records the first key that repeats
// within one object (nlohmann keeps the last silently), and the top-level key
// it sits under, so the caller can reject it.
struct DuplicateKey {
  std::string key;
  std::string top_level_key;  // empty when `key` itself is at the top level
};
absl::Status ParseJsonRejectingDuplicates(std::string_view text, Json* out,
                                          std::optional<DuplicateKey>* duplicate) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_level_key;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (depth == 1) top_level_key = key;
        if (!open_objects.back().insert(key).second && !duplicate->has_value()) {
          *duplicate = DuplicateKey{key, depth == 1 ? "" : top_level_key};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    *out = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

// Fills `*shape` and returns its byte count; InvalidArgument on a negative or
// non-integer dimension, or when the element or byte count overflows.
absl::StatusOr<uint64_t> ParseShape(const Json& shape_json, DType dtype, Shape* shape) {
  if (!shape_json.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'shape' must be an array of non-negative integers, got ", DescribeJson(shape_json)));
  }
  uint64_t numel = 1;
  for (const Json& dim : shape_json) {
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", JsonSnippet(shape_json), " has a negative dimension"));
    }
    if (!dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'shape' must be an array of non-negative integers, got ", DescribeJson(shape_json)));
    }
    uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, d, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", JsonSnippet(shape_json), " has too many elements"));
    }
    shape->push_back(static_cast<int64_t>(d));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, DTypeSize(dtype), &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", JsonSnippet(shape_json), " has too many bytes"));
  }
  return bytes;
}

// Fills `*info` from one tensor's header entry; messages say what is wrong
// without naming the tensor (the caller adds that).
absl::Status ParseTensorEntry(const Json& entry, size_t data_size, TensorInfo* info) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "entry must be an object with dtype, shape and data_offsets, got ", DescribeJson(entry)));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key))
      return absl::InvalidArgumentError(absl::StrCat("missing '", key, "'"));
  }
  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'dtype' must be a string, got ", DescribeJson(dtype)));
  }
  std::optional<DType> parsed = DTypeFromName(dtype.get_ref<const std::string&>());
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", JsonSnippet(dtype),
                                                   " (LAIR reads F32, BF16, F16, I32 and I64)"));
  }
  info->dtype = *parsed;
  absl::StatusOr<uint64_t> nbytes = ParseShape(entry["shape"], info->dtype, &info->shape);
  if (!nbytes.ok()) return nbytes.status();

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'data_offsets' must be [begin, end], two non-negative integers, got ",
                     DescribeJson(offsets)));
  }
  uint64_t begin = offsets[0].get<uint64_t>();
  uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", begin, ", ", end, "] end before they begin"));
  }
  if (end > data_size) {
    return absl::DataLossError(absl::StrCat("data_offsets [", begin, ", ", end,
                                            "] run past the end of the ", data_size,
                                            "-byte data section (truncated file?)"));
  }
  if (end - begin != *nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(DTypeName(info->dtype)), ShapeString(info->shape), " needs ", *nbytes,
                     " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin));
  }
  info->begin = begin;
  info->end = end;
  return absl::OkStatus();
}

absl::Status ParseMetadata(const Json& metadata, std::map<std::string, std::string>* out) {
  if (!metadata.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'__metadata__' must map strings to strings, got ", DescribeJson(metadata)));
  }
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'__metadata__' must map strings to strings; '", key, "' is ", DescribeJson(value)));
    }
    (*out)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

// Opens `shard`, a file inside `dir` that the index `index_path` names for
// `tensor`; errors name the index, the shard and the tensor.
absl::StatusOr<std::shared_ptr<const SafetensorsFile>> OpenShard(const std::string& index_path,
                                                                 const std::string& dir,
                                                                 const std::string& shard,
                                                                 const std::string& tensor) {
  std::filesystem::path relative(shard);
  bool escapes = relative.empty() || relative.is_absolute();
  for (const auto& part : relative) escapes = escapes || part == "..";
  if (escapes) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor,
                                                   "' is mapped to shard '", shard,
                                                   "', which is not a file inside ", dir));
  }
  auto file = SafetensorsFile::Open((std::filesystem::path(dir) / relative).string());
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(index_path, ": shard '", shard, "' (listed for tensor '",
                                     tensor, "'): ", file.status().message()));
  }
  return file;
}

}  // namespace

// Errors: DataLoss when the file is shorter than its header says (fewer than
// 8 bytes, a header length past the end, tensor data past the end);
// InvalidArgument for everything else that is malformed.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view bytes, size_t file_size,
                                                         std::string_view origin) {
  LAIR_CHECK(bytes.size() <= file_size);
  const absl::string_view where = Sv(origin);
  auto invalid = [where](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
  };
  if (file_size < 8) {
    return absl::DataLossError(
        absl::StrCat(where, ": the file is ", file_size, " bytes, too short to be safetensors"));
  }
  if (bytes.size() < 8) return invalid("only ", bytes.size(), " bytes given to the header parser");
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), sizeof(header_len));
  if (header_len > kMaxHeaderBytes) {
    return invalid("header length ", header_len, " is over safetensors' limit of ", kMaxHeaderBytes,
                   " bytes (not a safetensors file?)");
  }
  if (header_len > file_size - 8) {
    return absl::DataLossError(absl::StrCat(where, ": header length ", header_len,
                                            " runs past the end of the ", file_size,
                                            "-byte file (truncated?)"));
  }
  if (bytes.size() - 8 < header_len) {
    return invalid("the ", bytes.size(), " bytes given do not hold the ", header_len,
                   "-byte header");
  }
  std::string_view text = bytes.substr(8, header_len);
  if (text.empty() || text.front() != '{') return invalid("the header does not start with '{'");

  Json root;
  std::optional<DuplicateKey> duplicate;
  if (absl::Status s = ParseJsonRejectingDuplicates(text, &root, &duplicate); !s.ok()) {
    return invalid("the header is not valid JSON: ", s.message());
  }
  if (duplicate.has_value()) {
    if (duplicate->top_level_key.empty())
      return invalid("duplicate tensor name '", duplicate->key, "'");
    return invalid("tensor '", duplicate->top_level_key, "': duplicate key '", duplicate->key, "'");
  }
  if (!root.is_object())
    return invalid("the header must be a JSON object, got ", DescribeJson(root));

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  const size_t data_size = file_size - header.data_offset;
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      if (absl::Status s = ParseMetadata(entry, &header.metadata); !s.ok()) {
        return invalid(s.message());
      }
      continue;
    }
    TensorInfo info;
    if (absl::Status s = ParseTensorEntry(entry, data_size, &info); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, ": tensor '", name, "': ", s.message()));
    }
    header.tensors.emplace(name, std::move(info));
  }

  // The data must be packed: sorted by offset, each tensor starts where the
  // previous ends, and the last ends at the end of the file.
  std::vector<std::tuple<size_t, size_t, const std::string*>> ranges;
  for (const auto& [name, info] : header.tensors) ranges.emplace_back(info.begin, info.end, &name);
  std::sort(ranges.begin(), ranges.end());
  size_t expected = 0;
  const std::string* previous = nullptr;
  for (const auto& [begin, end, name] : ranges) {
    if (begin < expected) {
      return invalid("tensors '", *previous, "' and '", *name, "' overlap (the second starts at ",
                     begin, ", the first ends at ", expected, ")");
    }
    if (begin > expected) {
      return invalid("a gap of ", begin - expected, " bytes before tensor '", *name,
                     "' (it starts at ", begin, ", the data before it ends at ", expected, ")");
    }
    expected = end;
    previous = name;
  }
  if (expected != data_size) {
    return invalid("the data section is ", data_size, " bytes but its tensors cover ", expected,
                   "; ", data_size - expected, " bytes at the end belong to no tensor");
  }
  return header;
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status status = absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot stat"));
    ::close(fd);
    return status;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->self_ = file;
  file->mapping_size_ = static_cast<size_t>(st.st_size);
  if (file->mapping_size_ > 0) {
    void* mapping = ::mmap(nullptr, file->mapping_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      absl::Status status = absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot mmap"));
      ::close(fd);
      return status;
    }
    file->mapping_ = mapping;
  }
  ::close(fd);  // the mapping keeps the file open
  std::string_view bytes(static_cast<const char*>(file->mapping_), file->mapping_size_);
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(bytes, file->mapping_size_, path);
  if (!header.ok()) return header.status();
  file->header_ = *std::move(header);
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

bool SafetensorsFile::Contains(std::string_view name) const {
  return header_.tensors.count(std::string(name)) > 0;
}

// Aliases the mapping (read-only memory) when the data is aligned for its
// dtype, as in every file written with safetensors' 8-byte header padding;
// otherwise returns an aligned copy.
absl::StatusOr<Tensor> SafetensorsFile::Get(std::string_view name) const {
  auto it = header_.tensors.find(std::string(name));
  if (it == header_.tensors.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", Sv(name), "'"));
  }
  const TensorInfo& info = it->second;
  char* data = static_cast<char*>(mapping_) + header_.data_offset + info.begin;
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(info.dtype) != 0) {
    return Tensor::Wrap(data, info.dtype, info.shape, Device::kCpu, nullptr).Clone();
  }
  // Shares ownership of this file, pointing at the tensor's bytes.
  std::shared_ptr<void> owner(self_.lock(), data);
  return Tensor::Wrap(data, info.dtype, info.shape, Device::kCpu, std::move(owner));
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  std::error_code ec;
  const std::string single = (fs::path(dir) / kSingleFile).string();
  if (fs::exists(single, ec)) {
    auto file = SafetensorsFile::Open(single);
    if (!file.ok()) return file.status();
    for (const auto& [name, info] : (*file)->header().tensors) checkpoint.by_name_[name] = *file;
    return checkpoint;
  }
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  if (!fs::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": holds neither ", kSingleFile, " nor ", kIndexFile));
  }
  LAIR_ASSIGN_OR_RETURN(ConfigReader index, ConfigReader::FromFile(index_path));
  LAIR_ASSIGN_OR_RETURN(std::optional<ConfigReader> weight_map, index.OptionalObject("weight_map"));
  if (!weight_map.has_value()) {
    return index.FieldError("weight_map", "missing, expected an object mapping tensors to shards");
  }
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> shards;
  for (const auto& item : weight_map->json().items()) {
    const std::string& name = item.key();
    LAIR_ASSIGN_OR_RETURN(std::string shard, weight_map->String(name));
    auto& file = shards[shard];
    if (file == nullptr) {
      auto opened = OpenShard(index_path, dir, shard, name);
      if (!opened.ok()) return opened.status();
      file = *std::move(opened);
    }
    if (!file->Contains(name)) {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor '", name,
                                              "' is listed in shard '", shard,
                                              "', which does not hold it"));
    }
    checkpoint.by_name_[name] = file;
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, file] : by_name_) names.push_back(name);
  return names;
}

bool Checkpoint::Contains(std::string_view name) const {
  return by_name_.find(name) != by_name_.end();
}

absl::StatusOr<Tensor> Checkpoint::Get(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", Sv(name), "' is not in the checkpoint ", dir_));
  }
  return it->second->Get(name);
}

absl::StatusOr<Tensor> Checkpoint::GetF32(std::string_view name, const Shape& shape) const {
  LAIR_ASSIGN_OR_RETURN(Tensor t, Get(name));
  const std::string what = absl::StrCat("tensor '", Sv(name), "' in ", dir_);
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", Sv(DTypeName(t.dtype())), ", expected F32, BF16 or F16"));
  }
  LAIR_RETURN_IF_ERROR(ExpectShape(t, shape, what));
  if (t.dtype() == DType::kF32) return t;
  return t.ToF32();
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto invalid = [&path](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parts...));
  };
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  size_t offset = 0;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) return invalid("'", kMetadataKey, "' cannot name a tensor");
    if (!seen.insert(name).second) return invalid("duplicate tensor name '", name, "'");
    if (!t.defined()) return invalid("tensor '", name, "' is undefined");
    if (t.device() != Device::kCpu) return invalid("tensor '", name, "' is not on the host");
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(DTypeName(t.dtype()));
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(entry);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    return invalid("cannot encode the header (a name that is not UTF-8?): ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // as safetensors does: data 8-byte aligned
  const uint64_t header_len = text.size();

  // Written beside the target and renamed over it, so readers never see half a file.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat(tmp, ": cannot create"));
  bool ok = std::fwrite(&header_len, sizeof(header_len), 1, f) == 1 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& [name, t] : tensors) {
    ok = ok && std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
  }
  int write_errno = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    write_errno = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    write_errno = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(write_errno, absl::StrCat(path, ": cannot write"));
  }
  return absl::OkStatus();
}

}  // namespace lair
