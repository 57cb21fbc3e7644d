// How request errors travel from validation to the protocol edge.
//
// Everything inside server/ reports errors as absl::Status. An
// InvalidArgument about one request field carries the field's name as a
// payload (ParamError), so the HTTP edge can fill OpenAI's "param"; the gRPC
// edge puts the same text in its message. The code -> protocol mapping lives
// only here (HTTP) and in grpc_service.cc (gRPC).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "nlohmann/json.hpp"

namespace lair::server {

// InvalidArgument("PARAM: MESSAGE") remembering PARAM.
absl::Status ParamError(std::string_view param, std::string_view message);
// Unimplemented("PARAM: MESSAGE") remembering PARAM: a well-formed request
// for something LAIR does not do.
absl::Status UnsupportedParamError(std::string_view param, std::string_view message);
// The PARAM of a ParamError or UnsupportedParamError; empty for any other status.
std::string ErrorParam(const absl::Status& status);

// HTTP status for a non-OK status: InvalidArgument 400, Unauthenticated 401,
// NotFound 404, Unimplemented 422 (understood but not supported, e.g.
// echo=true), ResourceExhausted 429 (queue full), FailedPrecondition and
// Unavailable 503 (shutting down), anything else 500.
int HttpStatusFor(const absl::Status& status);

// Compact JSON; invalid UTF-8 in strings is replaced, never thrown on.
std::string DumpJson(const nlohmann::json& json);

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
nlohmann::json OpenAiErrorBody(const absl::Status& status);

}  // namespace lair::server
