// Reading tokenizer JSON without exceptions. Each accessor checks the type
// of one field and, when it is wrong, returns InvalidArgument naming the
// file and the field path ("FILE: pre_tokenizer.pretokenizers[1].pattern").
// `where` is always that "FILE: path" prefix of the enclosing object.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// The steps of a "Sequence" component: Step::FromJson of every element of
// the required array `key` of `obj`, each error naming the element's path.
template <typename Step>
absl::StatusOr<std::vector<std::unique_ptr<Step>>> SequenceSteps(const Json& obj,
                                                                 std::string_view key,
                                                                 const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(const Json* list, RequiredArray(obj, key, where));
  std::vector<std::unique_ptr<Step>> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    LAIR_ASSIGN_OR_RETURN(auto step,
                          Step::FromJson((*list)[i], IndexPath(FieldPath(where, key), i)));
    steps.push_back(std::move(step));
  }
  return steps;
}

}  // namespace lair::tok
