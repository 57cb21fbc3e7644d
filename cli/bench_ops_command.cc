// `lair bench ops`: throughput of the mixer kernels on one backend. Each op
// runs one sequence of --seq-len tokens with --heads heads of K = V = --dim
// (GSA: --slots slots) from random inputs, once per column after one untimed
// warm-up of the chunked forward, and prints tokens per second: chunked
// forward, recurrent forward, and the backward. On the CPU it also prints
// tokens per CPU-second of the process, which other load on a shared machine
// disturbs much less than the wall clock.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/bench_command.h"
#include "cli/command_registry.h"
#include "kernels/backend.h"

namespace lair::cli {
namespace {

struct BenchOpsFlags {
  std::string device = "cpu";
  int seq_len = 4096;
  int heads = 4;
  int dim = 128;
  int slots = 64;
  int chunk_size = 64;
};

// Random host tensors uploaded to the backend as F32.
class Inputs {
 public:
  Inputs(kernels::Backend& backend, uint32_t seed) : backend_(backend), rng_(seed) {}

  absl::StatusOr<Tensor> Uniform(Shape shape, float lo, float hi) {
    Tensor host = Tensor::Zeros(DType::kF32, std::move(shape));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t e = 0; e < host.numel(); ++e) host.f32()[e] = dist(rng_);
    return backend_.Upload(host, DType::kF32);
  }
  absl::StatusOr<Tensor> Zeros(Shape shape) {
    return backend_.Allocate(DType::kF32, std::move(shape));
  }

 private:
  kernels::Backend& backend_;
  std::mt19937 rng_;
};

// One row of the table: the three timed calls of an op.
struct OpCalls {
  std::string name;
  std::function<absl::Status(kernels::MixerForm)> forward;
  std::function<absl::Status()> backward;
};

// How long one call took.
struct Timing {
  double wall = 0;  // seconds
  double cpu = 0;   // CPU-seconds of the whole process (all its threads)
};

// Times one call, or returns the error it returned.
absl::StatusOr<Timing> Time(kernels::Backend& backend, const std::function<absl::Status()>& call) {
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  LAIR_RETURN_IF_ERROR(call());
  LAIR_RETURN_IF_ERROR(backend.Synchronize());
  return Timing{std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC};
}

// The batch of one sequence of T tokens in slot 0 (device copies on CUDA).
class OneSequence {
 public:
  static absl::StatusOr<std::unique_ptr<OneSequence>> Make(kernels::Backend& backend, int tokens) {
    auto seq = std::unique_ptr<OneSequence>(new OneSequence());
    seq->cu_seqlens_ = {0, tokens};
    seq->batch_.num_seqs = 1;
    seq->batch_.cu_seqlens = seq->cu_seqlens_;
    seq->batch_.state_slot = seq->slots_;
    seq->batch_.max_seqlen = tokens;
    if (backend.device() == Device::kCuda) {
      Tensor cu = Tensor::Zeros(DType::kI32, {2}), slot = Tensor::Zeros(DType::kI32, {1});
      cu.data<int32_t>()[1] = tokens;
      LAIR_ASSIGN_OR_RETURN(seq->cu_device_, backend.Upload(cu, DType::kI32));
      LAIR_ASSIGN_OR_RETURN(seq->slot_device_, backend.Upload(slot, DType::kI32));
      seq->batch_.cu_seqlens_device = seq->cu_device_.data<int32_t>();
      seq->batch_.state_slot_device = seq->slot_device_.data<int32_t>();
    }
    return seq;
  }
  const kernels::SequenceBatch& batch() const { return batch_; }

 private:
  OneSequence() = default;
  std::vector<int32_t> cu_seqlens_, slots_ = {0};
  Tensor cu_device_, slot_device_;
  kernels::SequenceBatch batch_;
};

absl::StatusOr<OpCalls> DecayCalls(kernels::Backend& backend, const kernels::SequenceBatch& batch,
                                   const BenchOpsFlags& f, kernels::DecayKind kind,
                                   std::string name) {
  const int64_t n = f.seq_len, H = f.heads, D = f.dim;
  Inputs in(backend, 1);
  kernels::DecayForwardArgs args;
  args.kind = kind;
  args.heads = f.heads;
  args.key_dim = args.value_dim = f.dim;
  args.scale = 1.0f / std::sqrt(static_cast<float>(f.dim));
  args.chunk_size = f.chunk_size;
  LAIR_ASSIGN_OR_RETURN(args.q, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.k, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.v, in.Uniform({n, H, D}, -1, 1));
  if (kind == kernels::DecayKind::kConstant) {
    LAIR_ASSIGN_OR_RETURN(args.log_gamma, in.Uniform({H}, -0.1f, -0.01f));
  }
  if (kind == kernels::DecayKind::kScalar) {
    LAIR_ASSIGN_OR_RETURN(args.g, in.Uniform({n, H}, -0.5f, -0.01f));
  }
  if (kind == kernels::DecayKind::kVector || kind == kernels::DecayKind::kLeftRight) {
    LAIR_ASSIGN_OR_RETURN(args.gk, in.Uniform({n, H, D}, -0.5f, -0.01f));
  }
  if (kind == kernels::DecayKind::kLeftRight) {
    LAIR_ASSIGN_OR_RETURN(args.gv, in.Uniform({n, H, D}, -0.5f, -0.01f));
  }
  LAIR_ASSIGN_OR_RETURN(args.o, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(args.state, in.Zeros({1, H, D, D}));

  kernels::DecayBackwardArgs grad;
  grad.fwd = args;
  LAIR_ASSIGN_OR_RETURN(grad.d_o, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(grad.dq, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.dk, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.dv, in.Zeros({n, H, D}));
  if (kind == kernels::DecayKind::kConstant) {
    LAIR_ASSIGN_OR_RETURN(grad.d_log_gamma, in.Zeros({H}));
  }
  if (kind == kernels::DecayKind::kScalar) {
    LAIR_ASSIGN_OR_RETURN(grad.dg, in.Zeros({n, H}));
  }
  if (args.gk.defined()) {
    LAIR_ASSIGN_OR_RETURN(grad.dgk, in.Zeros({n, H, D}));
  }
  if (args.gv.defined()) {
    LAIR_ASSIGN_OR_RETURN(grad.dgv, in.Zeros({n, H, D}));
  }
  return OpCalls{std::move(name),
                 [&backend, &batch, args](kernels::MixerForm form) {
                   return backend.DecayForward(batch, args, form);
                 },
                 [&backend, &batch, grad] { return backend.DecayBackward(batch, grad); }};
}

absl::StatusOr<OpCalls> GsaCalls(kernels::Backend& backend, const kernels::SequenceBatch& batch,
                                 const BenchOpsFlags& f) {
  const int64_t n = f.seq_len, H = f.heads, D = f.dim, M = f.slots;
  Inputs in(backend, 2);
  kernels::GsaForwardArgs args;
  args.heads = f.heads;
  args.key_dim = args.value_dim = f.dim;
  args.num_slots_m = f.slots;
  args.scale = 1.0f / std::sqrt(static_cast<float>(f.dim));
  args.chunk_size = f.chunk_size;
  LAIR_ASSIGN_OR_RETURN(args.q, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.k, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.v, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.s, in.Uniform({n, H, M}, 0.01f, 0.4f));
  LAIR_ASSIGN_OR_RETURN(args.g, in.Uniform({n, H, M}, -0.5f, -0.01f));
  LAIR_ASSIGN_OR_RETURN(args.o, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(args.state_k, in.Zeros({1, H, D, M}));
  LAIR_ASSIGN_OR_RETURN(args.state_v, in.Zeros({1, H, M, D}));

  kernels::GsaBackwardArgs grad;
  grad.fwd = args;
  LAIR_ASSIGN_OR_RETURN(grad.d_o, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(grad.dq, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.dk, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.dv, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.ds, in.Zeros({n, H, M}));
  LAIR_ASSIGN_OR_RETURN(grad.dg, in.Zeros({n, H, M}));
  return OpCalls{"gsa",
                 [&backend, &batch, args](kernels::MixerForm form) {
                   return backend.GsaForward(batch, args, form);
                 },
                 [&backend, &batch, grad] { return backend.GsaBackward(batch, grad); }};
}

absl::StatusOr<OpCalls> MlstmCalls(kernels::Backend& backend, const kernels::SequenceBatch& batch,
                                   const BenchOpsFlags& f) {
  const int64_t n = f.seq_len, H = f.heads, D = f.dim;
  Inputs in(backend, 3);
  kernels::MlstmForwardArgs args;
  args.kind = kernels::MlstmKind::kExp;
  args.heads = f.heads;
  args.key_dim = args.value_dim = f.dim;
  args.chunk_size = f.chunk_size;
  LAIR_ASSIGN_OR_RETURN(args.q, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.k, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.v, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(args.i, in.Uniform({n, H}, -2, 2));
  LAIR_ASSIGN_OR_RETURN(args.f, in.Uniform({n, H}, 0, 4));
  LAIR_ASSIGN_OR_RETURN(args.h, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(args.state_c, in.Zeros({1, H, D, D}));
  LAIR_ASSIGN_OR_RETURN(args.state_n, in.Zeros({1, H, D}));
  LAIR_ASSIGN_OR_RETURN(args.state_m, in.Zeros({1, H}));

  kernels::MlstmBackwardArgs grad;
  grad.fwd = args;
  LAIR_ASSIGN_OR_RETURN(grad.d_h, in.Uniform({n, H, D}, -1, 1));
  LAIR_ASSIGN_OR_RETURN(grad.dq, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.dk, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.dv, in.Zeros({n, H, D}));
  LAIR_ASSIGN_OR_RETURN(grad.di, in.Zeros({n, H}));
  LAIR_ASSIGN_OR_RETURN(grad.df, in.Zeros({n, H}));
  return OpCalls{"mlstm_exp",
                 [&backend, &batch, args](kernels::MixerForm form) {
                   return backend.MlstmForward(batch, args, form);
                 },
                 [&backend, &batch, grad] { return backend.MlstmBackward(batch, grad); }};
}

// "123,456" tokens per (CPU-)second, or the error's code.
std::string Throughput(const absl::StatusOr<Timing>& timing, bool cpu_time, int tokens) {
  if (!timing.ok()) return std::string(absl::StatusCodeToString(timing.status().code()));
  const double seconds = cpu_time ? timing->cpu : timing->wall;
  if (seconds <= 0) return "-";
  const auto rate = static_cast<long long>(tokens / seconds);
  std::string digits = std::to_string(rate), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

int RunBenchOps(const BenchOpsFlags& flags) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::MakeBackend(flags.device);
  if (!backend.ok()) {
    std::fprintf(stderr, "lair bench ops: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  kernels::Backend& b = **backend;
  absl::StatusOr<std::unique_ptr<OneSequence>> seq = OneSequence::Make(b, flags.seq_len);
  if (!seq.ok()) {
    std::fprintf(stderr, "lair bench ops: %s\n", seq.status().ToString().c_str());
    return 1;
  }
  const kernels::SequenceBatch& batch = (*seq)->batch();
  std::printf(
      "backend %s; one sequence of T = %d tokens, %d heads, K = V = %d, chunk %d, GSA slots %d\n",
      b.Name().c_str(), flags.seq_len, flags.heads, flags.dim, flags.chunk_size, flags.slots);
  using kernels::DecayKind;
  const std::vector<std::function<absl::StatusOr<OpCalls>()>> makers = {
      [&] { return DecayCalls(b, batch, flags, DecayKind::kNone, "no_decay"); },
      [&] { return DecayCalls(b, batch, flags, DecayKind::kConstant, "constant_decay"); },
      [&] { return DecayCalls(b, batch, flags, DecayKind::kScalar, "scalar_decay"); },
      [&] { return DecayCalls(b, batch, flags, DecayKind::kVector, "vector_decay"); },
      [&] { return DecayCalls(b, batch, flags, DecayKind::kLeftRight, "left_right_decay"); },
      [&] { return GsaCalls(b, batch, flags); },
      [&] { return MlstmCalls(b, batch, flags); },
  };
  struct Row {
    std::string name;
    absl::StatusOr<Timing> chunked, recurrent, backward;
  };
  std::vector<Row> rows;
  int failures = 0;
  for (const auto& make : makers) {
    absl::StatusOr<OpCalls> calls = make();
    if (!calls.ok()) {
      std::fprintf(stderr, "lair bench ops: %s\n", calls.status().ToString().c_str());
      ++failures;
      continue;
    }
    // Warm-up: first-touch page faults and BLAS buffers stay out of the figures.
    const absl::Status warm = calls->forward(kernels::MixerForm::kChunked);
    if (!warm.ok()) {
      rows.push_back(Row{calls->name, warm, warm, warm});
      continue;
    }
    Row row{calls->name, Time(b, [&] { return calls->forward(kernels::MixerForm::kChunked); }),
            Time(b, [&] { return calls->forward(kernels::MixerForm::kRecurrent); }),
            Time(b, calls->backward)};
    rows.push_back(std::move(row));
  }
  for (bool cpu_time : {false, true}) {
    if (cpu_time && b.device() != Device::kCpu) break;
    std::printf("\n%-18s %16s %16s %16s\n", cpu_time ? "tokens/CPU-second" : "tokens/second",
                "chunked fwd", "recurrent fwd", "backward");
    for (const Row& row : rows) {
      std::printf("%-18s %16s %16s %16s\n", row.name.c_str(),
                  Throughput(row.chunked, cpu_time, flags.seq_len).c_str(),
                  Throughput(row.recurrent, cpu_time, flags.seq_len).c_str(),
                  Throughput(row.backward, cpu_time, flags.seq_len).c_str());
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

LAIR_REGISTER_COMMAND(bench_ops, [](CLI::App& app) {
  CLI::App* ops =
      BenchCommand(app)->add_subcommand("ops", "Throughput of the mixer kernels (tokens/s)");
  auto flags = std::make_shared<BenchOpsFlags>();
  ops->add_option("--device", flags->device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  ops->add_option("--seq-len", flags->seq_len, "Tokens in the sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ops->add_option("--heads", flags->heads, "Heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ops->add_option("--dim", flags->dim, "Key and value dim per head")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ops->add_option("--slots", flags->slots, "GSA memory slots M")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ops->add_option("--chunk-size", flags->chunk_size, "Chunk size of the chunked form")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ops->callback([flags] { SetExitCode(RunBenchOps(*flags)); });
});

}  // namespace lair::cli
