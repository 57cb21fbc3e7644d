// The OpenAI-compatible HTTP routes over an EngineClient:
//   POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
//   POST /tokenize, POST /detokenize (vLLM's),
//   GET /health, GET /metrics (Prometheus text).
// All but /health and /metrics require "Authorization: Bearer KEY" when
// `api_key` is set; those two stay open for probes and scrapers.
//
// A generation handler parses and validates the body, submits one engine
// request per prompt, then either streams chunks as SSE or answers once.
// A client that disconnects cancels its engine requests.
#pragma once

#include <string>

#include "server/engine_client.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"

namespace lair::server {

// `client` must outlive the handler.
HttpServer::Handler MakeOpenAiHandler(EngineClient* client, std::string api_key,
                                      OpenAiLimits limits);

// True when `authorization` is "Bearer KEY" (or `api_key` is empty).
bool BearerMatches(std::string_view authorization, const std::string& api_key);

}  // namespace lair::server
