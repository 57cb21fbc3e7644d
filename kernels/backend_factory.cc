// MakeBackend: device names to backends.
#include <charconv>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#ifdef LAIR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace lair::kernels {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(std::string_view device,
                                                     const BackendOptions& options) {
  if (device == "cpu") return MakeCpuBackend();
  if (device == "cuda" || device.starts_with("cuda:")) {
    int index = 0;
    if (device != "cuda") {
      const std::string_view digits = device.substr(5);
      const auto [end, error] =
          std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (error != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
          index < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("device: bad CUDA device index in \"", std::string(device), "\""));
      }
    }
#ifdef LAIR_HAVE_CUDA
    return MakeCudaBackend(index, options);
#else
    (void)options;
    return absl::UnimplementedError(
        absl::StrCat("device \"", std::string(device), "\": LAIR was built without CUDA"));
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("device: unknown device \"", std::string(device),
                                                 "\" (expected cpu, cuda or cuda:N)"));
}

}  // namespace lair::kernels
