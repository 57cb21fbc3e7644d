#include "tokenizer/json_fields.h"

#include "absl/strings/str_cat.h"

namespace lair::tok {

std::string FieldPath(const std::string& where, std::string_view key) {
  const char* separator = (!where.empty() && where.back() == ':') ? " " : ".";
  return absl::StrCat(where, separator, std::string(key));
}

std::string IndexPath(const std::string& where, size_t index) {
  return absl::StrCat(where, "[", index, "]");
}

absl::Status FieldError(const std::string& where, std::string_view key, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(FieldPath(where, key), ": ", std::string(message)));
}

const Json* FindField(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::string> RequiredString(const Json& obj, std::string_view key,
                                           const std::string& where) {
  const Json* field = FindField(obj, key);
  if (field == nullptr) return FieldError(where, key, "missing");
  if (!field->is_string()) return FieldError(where, key, "expected a string");
  return field->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                          const std::string& where) {
  const Json* field = FindField(obj, key);
  if (field == nullptr) return std::optional<std::string>();
  if (!field->is_string()) return FieldError(where, key, "expected a string");
  return std::optional<std::string>(field->get<std::string>());
}

absl::StatusOr<bool> OptionalBool(const Json& obj, std::string_view key, const std::string& where,
                                  bool fallback) {
  const Json* field = FindField(obj, key);
  if (field == nullptr) return fallback;
  if (!field->is_boolean()) return FieldError(where, key, "expected true or false");
  return field->get<bool>();
}

absl::StatusOr<int64_t> OptionalInt(const Json& obj, std::string_view key, const std::string& where,
                                    int64_t fallback) {
  const Json* field = FindField(obj, key);
  if (field == nullptr) return fallback;
  if (!field->is_number_integer()) return FieldError(where, key, "expected an integer");
  return field->get<int64_t>();
}

absl::StatusOr<const Json*> RequiredArray(const Json& obj, std::string_view key,
                                          const std::string& where) {
  const Json* field = FindField(obj, key);
  if (field == nullptr) return FieldError(where, key, "missing");
  if (!field->is_array()) return FieldError(where, key, "expected an array");
  return field;
}

absl::StatusOr<const Json*> RequiredObject(const Json& obj, std::string_view key,
                                           const std::string& where) {
  const Json* field = FindField(obj, key);
  if (field == nullptr) return FieldError(where, key, "missing");
  if (!field->is_object()) return FieldError(where, key, "expected an object");
  return field;
}

}  // namespace lair::tok
