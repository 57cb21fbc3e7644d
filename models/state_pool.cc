#include "models/state_pool.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace lair::models {
namespace {

// Save() format: "LAIRSTATE1", the tensor count, then per tensor its name
// (length-prefixed), dtype, rank and dimensions, then every tensor's bytes
// in layout order. Integers are little-endian uint64.
constexpr std::string_view kMagic = "LAIRSTATE1";

void PutU64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

bool GetU64(std::string_view* in, uint64_t* v) {
  if (in->size() < sizeof(*v)) return false;
  std::memcpy(v, in->data(), sizeof(*v));
  in->remove_prefix(sizeof(*v));
  return true;
}

}  // namespace

int64_t StateLayout::BytesPerSlot() const {
  int64_t bytes = 0;
  for (const StateTensorSpec& t : tensors)
    bytes += ShapeNumel(t.shape) * static_cast<int64_t>(DTypeSize(t.dtype));
  return bytes;
}

absl::StatusOr<StatePool> StatePool::Create(kernels::Backend* backend, const StateLayout& layout,
                                            int num_slots) {
  if (num_slots < 1)
    return absl::InvalidArgumentError(absl::StrCat("StatePool: ", num_slots, " slots"));
  StatePool pool;
  pool.backend_ = backend;
  pool.layout_ = layout;
  pool.num_slots_ = num_slots;
  for (const StateTensorSpec& spec : layout.tensors) {
    Shape shape = {num_slots};
    shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
    LAIR_ASSIGN_OR_RETURN(Tensor t, backend->Allocate(spec.dtype, shape));
    pool.tensors_.push_back(std::move(t));
  }
  return pool;
}

absl::Status StatePool::Zero(int slot) {
  if (slot < 0 || slot >= num_slots_)
    return absl::OutOfRangeError(absl::StrCat("StatePool: slot ", slot));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    LAIR_ASSIGN_OR_RETURN(Tensor zeros,
                          backend_->Allocate(layout_.tensors[i].dtype, layout_.tensors[i].shape));
    LAIR_RETURN_IF_ERROR(backend_->Copy(zeros, tensors_[i].Rows(slot, slot + 1)));
  }
  return absl::OkStatus();
}

absl::Status StatePool::CopySlot(int from, int to) {
  if (from < 0 || from >= num_slots_ || to < 0 || to >= num_slots_) {
    return absl::OutOfRangeError(absl::StrCat("StatePool: copy from slot ", from, " to ", to));
  }
  if (from == to) return absl::OkStatus();
  for (const Tensor& t : tensors_)
    LAIR_RETURN_IF_ERROR(backend_->Copy(t.Rows(from, from + 1), t.Rows(to, to + 1)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> StatePool::Save(int slot) {
  if (slot < 0 || slot >= num_slots_)
    return absl::OutOfRangeError(absl::StrCat("StatePool: slot ", slot));
  std::string out(kMagic);
  PutU64(&out, layout_.tensors.size());
  for (const StateTensorSpec& spec : layout_.tensors) {
    PutU64(&out, spec.name.size());
    out += spec.name;
    PutU64(&out, static_cast<uint64_t>(spec.dtype));
    PutU64(&out, spec.shape.size());
    for (int64_t d : spec.shape) PutU64(&out, static_cast<uint64_t>(d));
  }
  for (const Tensor& t : tensors_) {
    LAIR_ASSIGN_OR_RETURN(Tensor host, backend_->Download(t.Rows(slot, slot + 1)));
    out.append(static_cast<const char*>(host.raw()), host.nbytes());
  }
  return out;
}

absl::Status StatePool::Restore(int slot, const std::string& bytes) {
  if (slot < 0 || slot >= num_slots_)
    return absl::OutOfRangeError(absl::StrCat("StatePool: slot ", slot));
  auto corrupt = [](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("StatePool::Restore: ", std::string(why)));
  };
  std::string_view in(bytes);
  if (in.substr(0, kMagic.size()) != kMagic) return corrupt("not a saved LAIR state");
  in.remove_prefix(kMagic.size());
  uint64_t count;
  if (!GetU64(&in, &count) || count != layout_.tensors.size()) {
    return corrupt(absl::StrCat("saved state has another tensor count than this model's ",
                                layout_.tensors.size()));
  }
  for (const StateTensorSpec& spec : layout_.tensors) {
    uint64_t len, dtype, rank;
    if (!GetU64(&in, &len) || in.size() < len) return corrupt("truncated");
    std::string name(in.substr(0, len));
    in.remove_prefix(len);
    if (!GetU64(&in, &dtype) || !GetU64(&in, &rank)) return corrupt("truncated");
    Shape shape(rank);
    for (auto& d : shape) {
      uint64_t v;
      if (!GetU64(&in, &v)) return corrupt("truncated");
      d = static_cast<int64_t>(v);
    }
    if (name != spec.name || dtype != static_cast<uint64_t>(spec.dtype) || shape != spec.shape) {
      return corrupt(absl::StrCat("saved tensor '", name, "' ", ShapeString(shape),
                                  " does not match '", spec.name, "' ", ShapeString(spec.shape),
                                  " of this model"));
    }
  }
  if (static_cast<int64_t>(in.size()) != layout_.BytesPerSlot()) return corrupt("wrong data size");
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StateTensorSpec& spec = layout_.tensors[i];
    Tensor host = Tensor::Zeros(spec.dtype, spec.shape);
    std::memcpy(host.raw(), in.data(), host.nbytes());
    in.remove_prefix(host.nbytes());
    LAIR_ASSIGN_OR_RETURN(Tensor device, backend_->Upload(host, spec.dtype));
    LAIR_RETURN_IF_ERROR(backend_->Copy(device, tensors_[i].Rows(slot, slot + 1)));
  }
  return absl::OkStatus();
}

}  // namespace lair::models
