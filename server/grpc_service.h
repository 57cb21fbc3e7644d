// GrpcService: lair.v1.TextGeneration on gRPC's callback API, over the same
// EngineClient as the HTTP front end.
//
// Each Generate / GenerateStream call is a reactor object owning its state
// (see grpc_service.cc); a deadline or client cancellation reaches OnCancel,
// which cancels the engine request. Status codes map one to one
// (absl::StatusCode and grpc::StatusCode share their values): bad request
// INVALID_ARGUMENT, unknown model NOT_FOUND, wrong API key UNAUTHENTICATED,
// full queue RESOURCE_EXHAUSTED.
//
// Thread safety: gRPC calls the service from its own threads; the service
// holds no mutable state.
#pragma once

#include <string>

#include "grpcpp/grpcpp.h"
#include "lair/v1/lair.grpc.pb.h"
#include "server/engine_client.h"

namespace lair::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

class GrpcService final : public lair::v1::TextGeneration::CallbackService {
 public:
  // `client` must outlive the service. An empty `api_key` accepts every call.
  GrpcService(EngineClient* client, std::string api_key)
      : client_(client), api_key_(std::move(api_key)) {}

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const v1::GenerateRequest* request,
                                     v1::GenerateResponse* response) override;
  grpc::ServerWriteReactor<v1::GenerateStreamResponse>* GenerateStream(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  // OK, or Unauthenticated when the call lacks "authorization: Bearer KEY".
  absl::Status Authenticate(const grpc::CallbackServerContext& context) const;
  // Finishes a unary call through the default reactor, recording metrics.
  grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                      const absl::Status& status);

  EngineClient* const client_;
  const std::string api_key_;
};

}  // namespace lair::server
