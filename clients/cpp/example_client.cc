// lair_example_client: calls a LAIR server over gRPC from C++.
//
//   lair_example_client [--target HOST:PORT] [--api-key KEY] [--max-tokens N]
//                       [--stream] PROMPT
//
// Prints the generated text (streamed as it arrives with --stream). Exits 1
// with the gRPC status on failure.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "lair/v1/lair.grpc.pb.h"

namespace {

struct Options {
  std::string target = "localhost:50051";
  std::string api_key;
  int max_tokens = 32;
  bool stream = false;
  std::string prompt;
};

bool ParseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--target") == 0 && has_value) {
      options->target = argv[++i];
    } else if (std::strcmp(argv[i], "--api-key") == 0 && has_value) {
      options->api_key = argv[++i];
    } else if (std::strcmp(argv[i], "--max-tokens") == 0 && has_value) {
      options->max_tokens = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--stream") == 0) {
      options->stream = true;
    } else if (argv[i][0] != '-' && options->prompt.empty()) {
      options->prompt = argv[i];
    } else {
      return false;
    }
  }
  return !options->prompt.empty();
}

int Fail(const grpc::Status& status) {
  std::fprintf(stderr, "error: %d: %s\n", static_cast<int>(status.error_code()),
               status.error_message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!ParseArgs(argc, argv, &options)) {
    std::fprintf(
        stderr,
        "usage: %s [--target HOST:PORT] [--api-key KEY] [--max-tokens N] [--stream] PROMPT\n",
        argv[0]);
    return 2;
  }
  auto stub = lair::v1::TextGeneration::NewStub(
      grpc::CreateChannel(options.target, grpc::InsecureChannelCredentials()));
  lair::v1::GenerateRequest request;
  request.set_text(options.prompt);
  request.mutable_sampling()->set_max_tokens(options.max_tokens);
  request.mutable_sampling()->set_temperature(0);

  grpc::ClientContext context;
  if (!options.api_key.empty()) context.AddMetadata("authorization", "Bearer " + options.api_key);
  if (options.stream) {
    std::unique_ptr<grpc::ClientReader<lair::v1::GenerateStreamResponse>> reader =
        stub->GenerateStream(&context, request);
    lair::v1::GenerateStreamResponse message;
    while (reader->Read(&message)) {
      std::fputs(message.text().c_str(), stdout);
      std::fflush(stdout);
    }
    std::fputs("\n", stdout);
    grpc::Status status = reader->Finish();
    return status.ok() ? 0 : Fail(status);
  }
  lair::v1::GenerateResponse response;
  grpc::Status status = stub->Generate(&context, request, &response);
  if (!status.ok()) return Fail(status);
  std::printf("%s\n", response.completions(0).text().c_str());
  std::fprintf(stderr, "finish: %s, tokens: %d prompt + %d generated\n",
               response.completions(0).finish_reason().c_str(), response.usage().prompt_tokens(),
               response.usage().completion_tokens());
  return 0;
}
