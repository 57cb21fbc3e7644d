#include "server/api_error.h"

#include "absl/strings/cord.h"

namespace lair::server {
namespace {
constexpr char kParamPayload[] = "type.lair.dev/param";
}  // namespace

absl::Status ParamError(std::string_view param, std::string_view message) {
  absl::Status status =
      absl::InvalidArgumentError(std::string(param) + ": " + std::string(message));
  status.SetPayload(kParamPayload, absl::Cord(std::string(param)));
  return status;
}

absl::Status UnsupportedParamError(std::string_view param, std::string_view message) {
  absl::Status status = absl::UnimplementedError(std::string(param) + ": " + std::string(message));
  status.SetPayload(kParamPayload, absl::Cord(std::string(param)));
  return status;
}

std::string DumpJson(const nlohmann::json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ErrorParam(const absl::Status& status) {
  auto payload = status.GetPayload(kParamPayload);
  return payload ? std::string(*payload) : std::string();
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnimplemented:
      return 422;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

nlohmann::json OpenAiErrorBody(const absl::Status& status) {
  const int http = HttpStatusFor(status);
  const char* type = http == 401   ? "authentication_error"
                     : http == 404 ? "not_found_error"
                     : http == 429 ? "rate_limit_error"
                     : http >= 500 ? "server_error"
                                   : "invalid_request_error";
  std::string param = ErrorParam(status);
  std::string code = absl::StatusCodeToString(status.code());
  for (char& c : code) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return {{"error",
           {{"message", std::string(status.message())},
            {"type", type},
            {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
            {"code", code}}}};
}

}  // namespace lair::server
