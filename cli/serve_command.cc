// `lair serve --model DIR [...]`: loads a model, its tokenizer and the
// engine, then serves the OpenAI-compatible HTTP API and the lair.v1 gRPC
// API until SIGINT or SIGTERM, when it shuts down gracefully (stops
// accepting, lets requests in flight finish within --shutdown-grace, then
// cancels the rest). Flags are parsed here, once, into a ServerConfig and an
// EngineConfig; nothing below reads a flag. Exits 2 when something does not
// load or a port cannot be bound.
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "cli/serving_model.h"
#include "engine/engine.h"
#include "server/server.h"
#include "server/shutdown_signal.h"
#include "spdlog/spdlog.h"
#include "tokenizer/tokenizer.h"

namespace lair::cli {
namespace {

struct ServeFlags {
  ServingModelFlags model;
  std::string tokenizer;  // empty: the model folder
  double shutdown_grace_seconds = 10;
  server::ServerConfig server;
  engine::EngineConfig engine;
};

// Lets the process hold as many connections as the hard limit allows.
void RaiseFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int RunServe(ServeFlags flags) {
  server::InstallTerminationHandlers();
  RaiseFileLimit();
  flags.server.shutdown_grace = absl::Seconds(flags.shutdown_grace_seconds);
  if (flags.server.served_model_name.empty()) {
    flags.server.served_model_name =
        std::filesystem::path(flags.model.model).lexically_normal().filename().string();
    if (flags.server.served_model_name.empty()) {
      flags.server.served_model_name =
          std::filesystem::path(flags.model.model).parent_path().filename().string();
    }
  }
  const std::string tokenizer_dir = flags.tokenizer.empty() ? flags.model.model : flags.tokenizer;
  auto fail = [](const absl::Status& status) {
    spdlog::error("lair serve: {}", status.ToString());
    return 2;
  };

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(tokenizer_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  absl::StatusOr<ServingRunner> loaded = LoadServingRunner(flags.model);
  if (!loaded.ok()) return fail(loaded.status());
  spdlog::info("one-sequence decode steps run on {}", loaded->decode_path);
  spdlog::info("model {}", loaded->model);
  std::unique_ptr<engine::ModelRunnerImpl>& runner = loaded->runner;
  if ((*tokenizer)->VocabSize() > runner->vocab_size()) {
    return fail(absl::InvalidArgumentError(
        "the tokenizer in " + tokenizer_dir + " has " + std::to_string((*tokenizer)->VocabSize()) +
        " tokens but the model only " + std::to_string(runner->vocab_size())));
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Engine::Create(std::move(runner), tokenizer->get(), flags.engine);
  if (!engine.ok()) return fail(engine.status());
  const engine::EngineStats capacity = (*engine)->Stats();
  spdlog::info(
      "engine: {} state slots of {} bytes, max_batch_tokens {}, max_running {}, max_waiting {}, "
      "max_prompt_tokens {}, max_new_tokens {}",
      capacity.slots_total, capacity.bytes_per_slot, flags.engine.max_batch_tokens,
      flags.engine.max_running, flags.engine.max_waiting, flags.engine.max_prompt_tokens,
      flags.engine.max_new_tokens);

  absl::StatusOr<std::unique_ptr<server::Server>> server =
      server::Server::Start(flags.server, flags.engine, engine->get(), tokenizer->get());
  if (!server.ok()) return fail(server.status());
  spdlog::info("serving `{}`: HTTP on {}:{}, gRPC on {}:{}, API key {}",
               flags.server.served_model_name, flags.server.host, (*server)->http_port(),
               flags.server.host, (*server)->grpc_port(),
               flags.server.api_key.empty() ? "off" : "required");
  const int signal = server::WaitForTerminationSignal();
  spdlog::info("signal {}: shutting down (grace {}s)", signal, flags.shutdown_grace_seconds);
  (*server)->Shutdown();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

LAIR_REGISTER_COMMAND(serve, [](CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("serve", "Serve a model over OpenAI-compatible HTTP and gRPC");
  auto flags = std::make_shared<ServeFlags>();
  server::ServerConfig& s = flags->server;
  engine::EngineConfig& e = flags->engine;
  command->add_option("--model", flags->model.model, "Model folder (config.json and weights)")
      ->required();
  command->add_option("--tokenizer", flags->tokenizer,
                      "Tokenizer folder (default: the model folder)");
  command->add_option("--served-model-name", s.served_model_name,
                      "Name clients use (default: the model folder's name)");
  command->add_option("--host", s.host, "Address to bind")->capture_default_str();
  command->add_option("--http-port", s.http_port, "OpenAI-compatible HTTP port (0: any free)")
      ->capture_default_str();
  command->add_option("--grpc-port", s.grpc_port, "gRPC port (0: any free)")->capture_default_str();
  command
      ->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' on both protocols")
      ->envname("LAIR_API_KEY");
  command->add_option("--device", flags->model.device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  command->add_option("--dtype", flags->model.dtype,
                      "Weight type: f32 or bf16 (default f32 on cpu, bf16 on cuda)");
  command
      ->add_option("--gemm", flags->model.gemm,
                   "Matrix products on CUDA: fast (tensor cores) or exact (fp32)")
      ->capture_default_str();
  command
      ->add_option("--max-context", flags->model.max_context,
                   "Context length for softmax-attention models")
      ->capture_default_str();
  command->add_option("--max-batch-tokens", e.max_batch_tokens, "Tokens per engine step")
      ->capture_default_str();
  command->add_option("--max-running", e.max_running, "Sequences per step")->capture_default_str();
  command->add_option("--max-waiting", e.max_waiting, "Queued requests before 429")
      ->capture_default_str();
  command
      ->add_option("--state-memory-bytes", e.state_memory_bytes,
                   "State-slot pool size (0: automatic)")
      ->capture_default_str();
  command->add_option("--max-prompt-tokens", e.max_prompt_tokens, "Longer prompts are refused")
      ->capture_default_str();
  command->add_option("--max-new-tokens", e.max_new_tokens, "Cap on max_tokens")
      ->capture_default_str();
  command
      ->add_option("--chat-default-max-tokens", s.chat_default_max_tokens,
                   "max_tokens for chat requests that give none")
      ->capture_default_str();
  command->add_option("--http-threads", s.http_threads, "HTTP I/O threads")->capture_default_str();
  command->add_option("--max-body-bytes", s.max_body_bytes, "Larger request bodies get 413")
      ->capture_default_str();
  command
      ->add_option("--shutdown-grace", flags->shutdown_grace_seconds,
                   "Seconds in-flight requests may take to finish on SIGTERM")
      ->capture_default_str();
  command->callback([flags] { SetExitCode(RunServe(*flags)); });
});

}  // namespace lair::cli
