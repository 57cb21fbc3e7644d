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
#include "engine/engine.h"
#include "engine/model_runner_impl.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "server/server.h"
#include "server/shutdown_signal.h"
#include "spdlog/spdlog.h"
#include "tokenizer/tokenizer.h"

namespace lair::cli {
namespace {

struct ServeFlags {
  std::string model;
  std::string tokenizer;  // empty: the model folder
  std::string device = "cpu";
  std::string dtype;          // empty: f32 on the CPU, bf16 on CUDA
  std::string gemm = "fast";  // kernels::GemmMode
  int max_context = 4096;     // KV length per sequence for softmax-attention families
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

absl::StatusOr<std::unique_ptr<engine::ModelRunner>> LoadRunner(const ServeFlags& flags) {
  kernels::BackendOptions backend_options;
  LAIR_ASSIGN_OR_RETURN(backend_options.gemm, kernels::ParseGemmMode(flags.gemm, "--gemm"));
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                        kernels::MakeBackend(flags.device, backend_options));
  models::LoadOptions options;
  const std::string dtype =
      flags.dtype.empty() ? (flags.device == "cpu" ? "f32" : "bf16") : flags.dtype;
  if (dtype != "f32" && dtype != "bf16")
    return absl::InvalidArgumentError("--dtype: use f32 or bf16");
  options.weight_dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  options.max_context = flags.max_context;
  options.fold_norm_weights = true;  // inference only
  options.fuse_low_rank_gates = true;
  options.persistent_decode = true;
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model,
                        models::Model::Load(flags.model, backend.get(), options));
  if (const absl::Status persistent = model->persistent_decode_status(); persistent.ok()) {
    spdlog::info("one-sequence decode steps run as the persistent decode kernel");
  } else {
    spdlog::info("one-sequence decode steps run on the step graphs ({})",
                 std::string(persistent.message()));
  }
  // Only softmax attention (llama) has a per-sequence context limit; the
  // recurrent families carry a fixed-size state.
  const int max_context = model->family() == "llama" ? flags.max_context : 0;
  spdlog::info("model {} ({}), vocabulary {}, on {}", flags.model, model->family(),
               model->vocab_size(), backend->Name());
  return std::unique_ptr<engine::ModelRunner>(
      new engine::ModelRunnerImpl(std::move(backend), std::move(model), max_context));
}

int RunServe(ServeFlags flags) {
  server::InstallTerminationHandlers();
  RaiseFileLimit();
  flags.server.shutdown_grace = absl::Seconds(flags.shutdown_grace_seconds);
  if (flags.server.served_model_name.empty()) {
    flags.server.served_model_name =
        std::filesystem::path(flags.model).lexically_normal().filename().string();
    if (flags.server.served_model_name.empty()) {
      flags.server.served_model_name =
          std::filesystem::path(flags.model).parent_path().filename().string();
    }
  }
  const std::string tokenizer_dir = flags.tokenizer.empty() ? flags.model : flags.tokenizer;
  auto fail = [](const absl::Status& status) {
    spdlog::error("lair serve: {}", status.ToString());
    return 2;
  };

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(tokenizer_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  absl::StatusOr<std::unique_ptr<engine::ModelRunner>> runner = LoadRunner(flags);
  if (!runner.ok()) return fail(runner.status());
  if ((*tokenizer)->VocabSize() > (*runner)->vocab_size()) {
    return fail(absl::InvalidArgumentError(
        "the tokenizer in " + tokenizer_dir + " has " + std::to_string((*tokenizer)->VocabSize()) +
        " tokens but the model only " + std::to_string((*runner)->vocab_size())));
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Engine::Create(std::move(*runner), tokenizer->get(), flags.engine);
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
  command->add_option("--model", flags->model, "Model folder (config.json and weights)")
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
  command->add_option("--device", flags->device, "cpu, cuda or cuda:N")->capture_default_str();
  command->add_option("--dtype", flags->dtype,
                      "Weight type: f32 or bf16 (default f32 on cpu, bf16 on cuda)");
  command
      ->add_option("--gemm", flags->gemm,
                   "Matrix products on CUDA: fast (tensor cores) or exact (fp32)")
      ->capture_default_str();
  command
      ->add_option("--max-context", flags->max_context,
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
