// lair_fake_server: the real HTTP and gRPC front ends over FakeEngine and
// FakeByteTokenizer, for the end-to-end protocol tests (e2e/) on machines
// without a model. Prints "LAIR_READY http=P grpc=Q" once both listen, and
// shuts down gracefully on SIGINT or SIGTERM.
#include <cstdio>
#include <exception>

#include "CLI/CLI.hpp"
#include "server/server.h"
#include "server/shutdown_signal.h"
#include "tests/server/fake_engine.h"
#include "tests/server/fake_tokenizer.h"

int main(int argc, char** argv) {
  try {
    lair::server::InstallTerminationHandlers();
    lair::server::ServerConfig config;
    config.host = "127.0.0.1";
    config.http_port = 0;
    config.grpc_port = 0;
    config.served_model_name = "fake";
    lair::engine::EngineConfig engine_config;
    engine_config.max_prompt_tokens = 4096;
    engine_config.max_running = 256;
    int step_delay_ms = 2;
    std::string chat_template;
    CLI::App app("LAIR front ends over a fake engine");
    app.add_option("--http-port", config.http_port);
    app.add_option("--grpc-port", config.grpc_port);
    app.add_option("--api-key", config.api_key);
    app.add_option("--served-model-name", config.served_model_name);
    app.add_option("--max-prompt-tokens", engine_config.max_prompt_tokens);
    app.add_option("--max-running", engine_config.max_running);
    app.add_option("--max-waiting", engine_config.max_waiting);
    app.add_option("--step-delay-ms", step_delay_ms);
    app.add_option("--chat-template", chat_template,
                   "chat template source (default: the fallback format)");
    CLI11_PARSE(app, argc, argv);

    lair::server::testing::FakeByteTokenizer tokenizer(chat_template);
    lair::server::testing::FakeEngine engine(&tokenizer, engine_config,
                                             absl::Milliseconds(step_delay_ms));
    auto server = lair::server::Server::Start(config, engine_config, &engine, &tokenizer);
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      return 1;
    }
    std::printf("LAIR_READY http=%d grpc=%d\n", (*server)->http_port(), (*server)->grpc_port());
    std::fflush(stdout);
    lair::server::WaitForTerminationSignal();
    (*server)->Shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lair_fake_server: %s\n", e.what());
    return 1;
  }
}
