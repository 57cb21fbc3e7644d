// Server: both front ends (OpenAI-compatible HTTP and lair.v1 gRPC with
// grpc.health.v1) over one EngineClient, started and stopped together.
//
// Shutdown order: stop accepting on both; let requests in flight finish
// within config.shutdown_grace (the engine's own Shutdown cancels what is
// left when the grace ends, which ends every stream); then stop the I/O.
//
// Thread safety: Shutdown may be called from any thread, once or more.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "server/engine_client.h"
#include "server/grpc_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/server_config.h"
#include "tokenizer/tokenizer.h"

namespace lair::server {

class Server {
 public:
  // Binds both ports (Unavailable naming the one that failed). `engine` and
  // `tokenizer` must outlive the server; `engine_config` supplies the prompt
  // and generation limits the front ends enforce.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerConfig& config,
                                                       const engine::EngineConfig& engine_config,
                                                       engine::Engine* engine,
                                                       const Tokenizer* tokenizer);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int http_port() const { return http_->port(); }
  int grpc_port() const { return grpc_port_; }

  // Graceful shutdown as described above; also shuts the engine down.
  void Shutdown();

 private:
  Server(const ServerConfig& config, engine::Engine* engine) : config_(config), engine_(engine) {}

  const ServerConfig config_;
  engine::Engine* const engine_;
  Metrics metrics_;
  std::unique_ptr<EngineClient> client_;
  std::unique_ptr<GrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int grpc_port_ = 0;
  std::unique_ptr<HttpServer> http_;
  bool shut_down_ = false;  // Shutdown ran
};

}  // namespace lair::server
