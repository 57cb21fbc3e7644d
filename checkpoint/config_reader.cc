#include "checkpoint/config_reader.h"

#include <cerrno>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal.h"

namespace lair {
namespace {

using checkpoint_internal::DescribeJson;
using checkpoint_internal::Sv;
using Json = nlohmann::json;

constexpr char kInteger[] = "an integer";
constexpr char kNumber[] = "a number";
constexpr char kBoolean[] = "a boolean";
constexpr char kString[] = "a string";
constexpr char kIntegerList[] = "an array of integers";

bool FitsInt(const Json& value) {
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int>::max());
  }
  if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    return v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max();
  }
  return false;
}

}  // namespace

ConfigReader::ConfigReader(Json json, std::string origin, std::string prefix)
    : json_(std::move(json)), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

absl::StatusOr<ConfigReader> ConfigReader::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  Json json;
  try {
    json = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  return FromJson(std::move(json), path);
}

absl::StatusOr<ConfigReader> ConfigReader::FromJson(Json json, std::string origin) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": expected a JSON object at the top level, got ", DescribeJson(json)));
  }
  return ConfigReader(std::move(json), std::move(origin), "");
}

const Json& ConfigReader::Field(std::string_view name) const {
  static const Json kNull;
  auto it = json_.find(name);
  return it == json_.end() ? kNull : *it;
}

bool ConfigReader::Has(std::string_view name) const { return !Field(name).is_null(); }

absl::Status ConfigReader::FieldError(std::string_view name, std::string_view problem) const {
  return absl::InvalidArgumentError(
      absl::StrCat(origin_, ": field '", prefix_, Sv(name), "': ", Sv(problem)));
}

absl::Status ConfigReader::Mismatch(std::string_view name, std::string_view expected) const {
  return FieldError(name,
                    absl::StrCat("expected ", Sv(expected), ", got ", DescribeJson(Field(name))));
}

template <typename T>
absl::StatusOr<T> ConfigReader::Required(std::string_view name,
                                         absl::StatusOr<std::optional<T>> value,
                                         std::string_view expected) const {
  if (!value.ok()) return value.status();
  if (!value->has_value()) {
    return FieldError(name, absl::StrCat("missing, expected ", Sv(expected)));
  }
  return **std::move(value);
}

absl::StatusOr<std::optional<int>> ConfigReader::OptionalInt(std::string_view name) const {
  const Json& v = Field(name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) return Mismatch(name, kInteger);
  if (!FitsInt(v)) return Mismatch(name, absl::StrCat(kInteger, " that fits in 32 bits"));
  return v.get<int>();
}

absl::StatusOr<int> ConfigReader::Int(std::string_view name) const {
  return Required(name, OptionalInt(name), kInteger);
}

absl::StatusOr<int> ConfigReader::Int(std::string_view name, int default_value) const {
  LAIR_ASSIGN_OR_RETURN(std::optional<int> v, OptionalInt(name));
  return v.value_or(default_value);
}

absl::StatusOr<std::optional<double>> ConfigReader::OptionalFloat(std::string_view name) const {
  const Json& v = Field(name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) return Mismatch(name, kNumber);
  return v.get<double>();
}

absl::StatusOr<double> ConfigReader::Float(std::string_view name) const {
  return Required(name, OptionalFloat(name), kNumber);
}

absl::StatusOr<double> ConfigReader::Float(std::string_view name, double default_value) const {
  LAIR_ASSIGN_OR_RETURN(std::optional<double> v, OptionalFloat(name));
  return v.value_or(default_value);
}

absl::StatusOr<std::optional<bool>> ConfigReader::OptionalBool(std::string_view name) const {
  const Json& v = Field(name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean()) return Mismatch(name, kBoolean);
  return v.get<bool>();
}

absl::StatusOr<bool> ConfigReader::Bool(std::string_view name) const {
  return Required(name, OptionalBool(name), kBoolean);
}

absl::StatusOr<bool> ConfigReader::Bool(std::string_view name, bool default_value) const {
  LAIR_ASSIGN_OR_RETURN(std::optional<bool> v, OptionalBool(name));
  return v.value_or(default_value);
}

absl::StatusOr<std::optional<std::string>> ConfigReader::OptionalString(
    std::string_view name) const {
  const Json& v = Field(name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_string()) return Mismatch(name, kString);
  return v.get<std::string>();
}

absl::StatusOr<std::string> ConfigReader::String(std::string_view name) const {
  return Required(name, OptionalString(name), kString);
}

absl::StatusOr<std::string> ConfigReader::String(std::string_view name,
                                                 std::string default_value) const {
  LAIR_ASSIGN_OR_RETURN(std::optional<std::string> v, OptionalString(name));
  return v.has_value() ? *std::move(v) : std::move(default_value);
}

absl::StatusOr<std::vector<int>> ConfigReader::IntList(std::string_view name,
                                                       std::vector<int> default_value) const {
  const Json& v = Field(name);
  if (v.is_null()) return default_value;
  if (!v.is_array()) return Mismatch(name, kIntegerList);
  std::vector<int> out;
  out.reserve(v.size());
  for (const Json& item : v) {
    if (!FitsInt(item)) return Mismatch(name, absl::StrCat(kIntegerList, " that fit in 32 bits"));
    out.push_back(item.get<int>());
  }
  return out;
}

absl::StatusOr<std::vector<int>> ConfigReader::IntList(std::string_view name) const {
  if (!Has(name)) return FieldError(name, absl::StrCat("missing, expected ", kIntegerList));
  return IntList(name, {});
}

absl::StatusOr<std::string> ConfigReader::OneOf(
    std::string_view name, std::initializer_list<std::string_view> choices) const {
  std::string expected = "one of ";
  const char* separator = "'";
  for (std::string_view choice : choices) {
    absl::StrAppend(&expected, separator, Sv(choice), "'");
    separator = ", '";
  }
  LAIR_ASSIGN_OR_RETURN(std::optional<std::string> v, OptionalString(name));
  if (!v.has_value()) return FieldError(name, absl::StrCat("missing, expected ", expected));
  for (std::string_view choice : choices) {
    if (*v == choice) return *std::move(v);
  }
  return Mismatch(name, expected);
}

absl::StatusOr<std::string> ConfigReader::OneOf(std::string_view name,
                                                std::initializer_list<std::string_view> choices,
                                                std::string_view default_value) const {
  if (!Has(name)) return std::string(default_value);
  return OneOf(name, choices);
}

absl::StatusOr<std::optional<ConfigReader>> ConfigReader::OptionalObject(
    std::string_view name) const {
  const Json& v = Field(name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_object()) return Mismatch(name, "an object");
  return ConfigReader(v, origin_, absl::StrCat(prefix_, Sv(name), "."));
}

}  // namespace lair
