// Helpers shared by checkpoint/*.cc; not part of the module's interface.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lair::checkpoint_internal {

// Debian's Abseil has its own string_view type; this hands a std one to StrCat.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A JSON value's text for an error message, cut short: `[2,-1]`, `"F64"`.
inline std::string JsonSnippet(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 48) text = text.substr(0, 45) + "...";
  return text;
}

// Its type and text: `number 5`, `string "2"`, `array [1,2]`, `null`.
inline std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_null()) return "null";
  return absl::StrCat(value.type_name(), " ", JsonSnippet(value));
}

}  // namespace lair::checkpoint_internal
