// ConfigReader: typed access to a model's config.json, shared by every model
// family's config parser.
//
// Every error is InvalidArgument (NotFound for a missing file) and names the
// file, the field and what was expected:
//   "/models/gla/config.json: field 'num_heads': expected an integer, got string \"2\""
// A field that is absent or null takes the default, in the variants that have
// one (Hugging Face configs write null for "use the default"); the variants
// without one fail on it. Fields nobody asks for are ignored.
//
// Thread safety: immutable after construction; may be shared between threads.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "nlohmann/json.hpp"

namespace lair {

class ConfigReader {
 public:
  // Reads `path`: NotFound when it cannot be opened, InvalidArgument when it
  // is not JSON or its top level is not an object.
  static absl::StatusOr<ConfigReader> FromFile(const std::string& path);
  // Wraps parsed JSON; `origin` names it in errors. InvalidArgument unless
  // `json` is an object.
  static absl::StatusOr<ConfigReader> FromJson(nlohmann::json json, std::string origin);

  const std::string& origin() const { return origin_; }
  const nlohmann::json& json() const { return json_; }
  // True when `name` is present and not null.
  bool Has(std::string_view name) const;

  // An integer in int's range (1.0 is not an integer).
  absl::StatusOr<int> Int(std::string_view name) const;
  absl::StatusOr<int> Int(std::string_view name, int default_value) const;
  absl::StatusOr<std::optional<int>> OptionalInt(std::string_view name) const;

  // Any JSON number.
  absl::StatusOr<double> Float(std::string_view name) const;
  absl::StatusOr<double> Float(std::string_view name, double default_value) const;
  absl::StatusOr<std::optional<double>> OptionalFloat(std::string_view name) const;

  absl::StatusOr<bool> Bool(std::string_view name) const;
  absl::StatusOr<bool> Bool(std::string_view name, bool default_value) const;
  absl::StatusOr<std::optional<bool>> OptionalBool(std::string_view name) const;

  absl::StatusOr<std::string> String(std::string_view name) const;
  absl::StatusOr<std::string> String(std::string_view name, std::string default_value) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view name) const;

  // An array of integers in int's range.
  absl::StatusOr<std::vector<int>> IntList(std::string_view name) const;
  absl::StatusOr<std::vector<int>> IntList(std::string_view name,
                                           std::vector<int> default_value) const;

  // A string that must be one of `choices` ("one of 'silu', 'gelu'").
  absl::StatusOr<std::string> OneOf(std::string_view name,
                                    std::initializer_list<std::string_view> choices) const;
  absl::StatusOr<std::string> OneOf(std::string_view name,
                                    std::initializer_list<std::string_view> choices,
                                    std::string_view default_value) const;

  // A nested object (such as "rope_scaling") as a reader whose errors name
  // the path ("field 'rope_scaling.factor'"); nullopt when absent or null.
  absl::StatusOr<std::optional<ConfigReader>> OptionalObject(std::string_view name) const;

  // InvalidArgument "<origin>: field '<name>': <problem>", for checks the
  // caller makes on a well-typed value ("must be positive").
  absl::Status FieldError(std::string_view name, std::string_view problem) const;

 private:
  ConfigReader(nlohmann::json json, std::string origin, std::string prefix);

  // The field's value, or null when absent; `name` must not be empty.
  const nlohmann::json& Field(std::string_view name) const;
  // A required field from an optional one: a missing value is an error.
  template <typename T>
  absl::StatusOr<T> Required(std::string_view name, absl::StatusOr<std::optional<T>> value,
                             std::string_view expected) const;
  absl::Status Mismatch(std::string_view name, std::string_view expected) const;

  nlohmann::json json_;  // always an object
  std::string origin_;   // the file, in messages
  std::string prefix_;   // "rope_scaling." for a nested reader, else empty
};

}  // namespace lair
