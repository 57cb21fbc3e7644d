#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "grpcpp/health_check_service_interface.h"
#include "server/openai_handlers.h"

namespace lair::server {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerConfig& config,
                                                      const engine::EngineConfig& engine_config,
                                                      engine::Engine* engine,
                                                      const Tokenizer* tokenizer) {
  std::unique_ptr<Server> server(new Server(config, engine));
  LAIR_ASSIGN_OR_RETURN(server->client_,
                        EngineClient::Create(engine, tokenizer, config.served_model_name,
                                             engine_config.max_prompt_tokens, &server->metrics_));

  server->grpc_service_ = std::make_unique<GrpcService>(server->client_.get(), config.api_key);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const bool ipv6 = config.host.find(':') != std::string::npos;
  const std::string address =
      (ipv6 ? "[" + config.host + "]" : config.host) + ":" + std::to_string(config.grpc_port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->grpc_port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_body_bytes));
  builder.RegisterService(server->grpc_service_.get());
  server->grpc_server_ = builder.BuildAndStart();
  if (!server->grpc_server_ || server->grpc_port_ == 0) {
    return absl::UnavailableError("grpc: cannot listen on " + address);
  }

  const OpenAiLimits limits{.chat_default_max_tokens = std::min(config.chat_default_max_tokens,
                                                                engine_config.max_new_tokens),
                            .max_tokens = engine_config.max_new_tokens};
  LAIR_ASSIGN_OR_RETURN(
      server->http_,
      HttpServer::Start(config, &server->metrics_,
                        MakeOpenAiHandler(server->client_.get(), config.api_key, limits)));
  return server;
}

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (http_) http_->StopAccepting();
  // gRPC's Shutdown stops new calls at once and waits for those in flight
  // until the deadline; it blocks, so it runs beside the engine's shutdown.
  std::thread grpc_stop;
  if (grpc_server_) {
    const auto deadline =
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(absl::ToInt64Milliseconds(config_.shutdown_grace)) +
        std::chrono::seconds(1);
    grpc_stop = std::thread([this, deadline] { grpc_server_->Shutdown(deadline); });
  }
  engine_->Shutdown(config_.shutdown_grace);
  // Every engine request has finished now; give the handlers a moment to
  // write their last bytes.
  if (http_) http_->Stop(absl::Seconds(2));
  if (grpc_stop.joinable()) grpc_stop.join();
}

}  // namespace lair::server
