// ServerConfig: everything the front ends need, filled once from the command
// line (cli/serve_command.cc) and passed down; nothing below reads a flag.
#pragma once

#include <cstddef>
#include <string>

#include "absl/time/time.h"

namespace lair::server {

struct ServerConfig {
  std::string host = "0.0.0.0";   // address both front ends bind
  int http_port = 8000;           // OpenAI-compatible HTTP; 0 picks a free port
  int grpc_port = 50051;          // lair.v1 gRPC; 0 picks a free port
  std::string api_key;            // required as "Bearer KEY" on both protocols; empty = open
  std::string served_model_name;  // the `model` clients name
  int chat_default_max_tokens =
      1024;              // chat requests giving no max_tokens (capped by the engine's limit)
  int http_threads = 2;  // I/O threads; each connection is a coroutine, not a thread
  size_t max_body_bytes = 8 << 20;                  // larger request bodies get 413
  absl::Duration idle_timeout = absl::Seconds(60);  // keep-alive connections idle longer are closed
  absl::Duration shutdown_grace = absl::Seconds(10);  // in-flight requests may finish within this
};

}  // namespace lair::server
