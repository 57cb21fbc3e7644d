// Reading tokenizer JSON without exceptions. Each accessor checks the type
// of one field and, when it is wrong, returns InvalidArgument naming the
// file and the field path ("FILE: pre_tokenizer.pretokenizers[1].pattern").
// `where` is always that "FILE: path" prefix of the enclosing object.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "nlohmann/json.hpp"

namespace lair::tok {

using Json = nlohmann::json;

// "where.key" (or "where key" right after the "FILE:" prefix).
std::string FieldPath(const std::string& where, std::string_view key);
std::string IndexPath(const std::string& where, size_t index);

absl::Status FieldError(const std::string& where, std::string_view key, std::string_view message);

// The member `key` of `obj`, or nullptr when absent or null.
const Json* FindField(const Json& obj, std::string_view key);

absl::StatusOr<std::string> RequiredString(const Json& obj, std::string_view key,
                                           const std::string& where);
absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                          const std::string& where);
absl::StatusOr<bool> OptionalBool(const Json& obj, std::string_view key, const std::string& where,
                                  bool fallback);
absl::StatusOr<int64_t> OptionalInt(const Json& obj, std::string_view key, const std::string& where,
                                    int64_t fallback);
// A required array or object member.
absl::StatusOr<const Json*> RequiredArray(const Json& obj, std::string_view key,
                                          const std::string& where);
absl::StatusOr<const Json*> RequiredObject(const Json& obj, std::string_view key,
                                           const std::string& where);

}  // namespace lair::tok
