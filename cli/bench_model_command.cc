// `lair bench decode` and `lair bench prefill`: a whole model's throughput on
// one backend, against a hardware rate measured in the same run.
//
//   lair bench decode  --model DIR [--device cpu|cuda] [--dtype f32|bf16] [--gemm fast|exact]
//                      --batch B --prompt-len P --gen-len G [--warmup N] [--no-graphs]
//                      [--keep-norm-weights] [--keep-low-rank-gates]
//   lair bench prefill --model DIR [--device cpu|cuda] [--dtype f32|bf16] [--gemm fast|exact]
//                      --batch B --prompt-len P [--warmup N] [--keep-norm-weights]
//                      [--scan-schedule auto|one-pass|two-pass|segmented]
//
// Both load DIR (projection matrices as --dtype; bf16 needs CUDA) on a
// backend multiplying as --gemm (kernels::GemmMode: fast, the serving
// default, is bf16 tensor cores), make a StatePool of B slots and prefill B
// random prompts of P tokens as one ForwardBatch (the mixers' chunked form)
// into zeroed slots. As `lair serve` does, the load folds the norms' weights
// into the products that read them (models::LoadOptions::fold_norm_weights)
// unless --keep-norm-weights, and fuses each low-rank gate's two products
// into one weight for the decode steps (LoadOptions::fuse_low_rank_gates)
// unless --keep-low-rank-gates.
//
// decode then runs N untimed and G timed steps of one token per sequence,
// each feeding back the step's greedy tokens (Model::ForwardGreedy: the
// argmax runs on the device; decode steps replay CUDA graphs unless
// --no-graphs, and one sequence's run as the persistent decode kernel where
// the model and backend have it unless --no-persistent). A step is timed
// from a synchronized backend to its host token ids. It also times the
// download of a [B, vocab] F32 tensor, what a host sampler's logits would
// add to each step. It reports B·G / (sum of the timed steps) in tokens/s,
// the mean and median step, and the step's memory floor: the weights a
// forward reads whole (ModelSize::forward_weight_bytes: an untied embedding
// table is left out, a lookup reads only B rows of it) plus every slot's
// state read and written (2 × BytesPerSlot × B), over the copy bandwidth
// measured in the same run (CUDA: a 1 GiB device-to-device Backend::Copy;
// CPU: a 256 MiB memcpy; bytes read + written, median of 5). "fraction of
// floor" = floor time / median step time.
//
// prefill runs N untimed prefills and one timed one, and reports B·P / time
// in tokens/s and its FLOP rate against a Backend::Gemm measured in the same
// run (F32 activations times --dtype weights on the same backend, as the
// projections run: with --gemm fast and bf16 that is cuBLASLt's bf16 tensor
// core GEMM after rounding the activations; CUDA 8192³, CPU 1024³; median
// of 5). FLOPs counted: 2 per projection-matrix
// element per token (ModelSize::matrix_parameters), 2 per head element per
// returned row (the last token of each sequence: B rows), and 4 per state
// element per token (each recurrent-state element updated and read once; for
// Llama, whose state is its KV cache, this overstates attention). Not
// counted: the chunked form's intra-chunk attention (about 2·C·(K+V) per head
// and token), norms, gates and other elementwise work. "fraction of matmul
// rate" = counted FLOP/s / Gemm FLOP/s.
//
// Each prints a table and a one-line summary starting "lair bench decode:"
// or "lair bench prefill:"; a bad flag is refused with a message naming it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "cli/bench_command.h"
#include "cli/command_registry.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/state_pool.h"

namespace lair::cli {
namespace {

struct BenchModelFlags {
  std::string model;
  std::string device = "cpu";
  std::string dtype = "f32";
  std::string gemm = "fast";
  std::string scan_schedule = "auto";  // kernels::ScanSchedule
  bool no_graphs = false;              // decode only
  bool no_persistent = false;          // decode only: LoadOptions::persistent_decode off
  bool keep_norm_weights = false;      // LoadOptions::fold_norm_weights off
  bool keep_low_rank_gates = false;    // LoadOptions::fuse_low_rank_gates off
  int batch = 1;
  int prompt_len = 0;
  int gen_len = 0;  // decode only
  int warmup = 0;
};

absl::Status Validate(const BenchModelFlags& f, bool decode) {
  if (f.dtype != "f32" && f.dtype != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be f32 or bf16, not '", f.dtype, "'"));
  }
  if (f.dtype == "bf16" && f.device == "cpu") {
    return absl::InvalidArgumentError(
        "--dtype bf16 needs --device cuda (the CPU backend computes in f32)");
  }
  LAIR_RETURN_IF_ERROR(kernels::ParseGemmMode(f.gemm, "--gemm").status());
  LAIR_RETURN_IF_ERROR(kernels::ParseScanSchedule(f.scan_schedule, "--scan-schedule").status());
  if (f.batch < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  if (f.prompt_len < 1) return absl::InvalidArgumentError("--prompt-len must be >= 1");
  if (decode && f.gen_len < 1) return absl::InvalidArgumentError("--gen-len must be >= 1");
  if (f.warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  const int64_t context = int64_t{f.prompt_len} + f.warmup + f.gen_len;
  if (int64_t{f.batch} * f.prompt_len > std::numeric_limits<int32_t>::max() ||
      context > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        "--batch × --prompt-len (and --prompt-len + --warmup + --gen-len) "
        "must stay below 2^31 tokens");
  }
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Median seconds of `reps` synchronized calls, after one untimed call.
absl::StatusOr<double> MedianSeconds(kernels::Backend& backend, int reps,
                                     const std::function<absl::Status()>& call) {
  LAIR_RETURN_IF_ERROR(call());
  LAIR_RETURN_IF_ERROR(backend.Synchronize());
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    LAIR_RETURN_IF_ERROR(call());
    LAIR_RETURN_IF_ERROR(backend.Synchronize());
    seconds.push_back(SecondsSince(start));
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Copy bandwidth in bytes (read + written) per second; see the file comment.
absl::StatusOr<double> CopyBandwidth(kernels::Backend& backend) {
  if (backend.device() == Device::kCpu) {
    const size_t bytes = size_t{256} << 20;
    std::vector<char> src(bytes, 1), dst(bytes);
    LAIR_ASSIGN_OR_RETURN(double t, MedianSeconds(backend, 5, [&] {
                            std::memcpy(dst.data(), src.data(), bytes);
                            return absl::OkStatus();
                          }));
    return 2.0 * bytes / t;
  }
  LAIR_ASSIGN_OR_RETURN(Tensor src, backend.Allocate(DType::kF32, {int64_t{1} << 28}));
  LAIR_ASSIGN_OR_RETURN(Tensor dst, backend.Allocate(DType::kF32, {int64_t{1} << 28}));
  LAIR_ASSIGN_OR_RETURN(double t,
                        MedianSeconds(backend, 5, [&] { return backend.Copy(src, dst); }));
  return 2.0 * static_cast<double>(src.nbytes()) / t;
}

// FLOP/s of an n×n×n Backend::Gemm, F32 activations times `weight_dtype`
// weights (n = 8192 on CUDA, 1024 on the CPU).
absl::StatusOr<double> GemmRate(kernels::Backend& backend, DType weight_dtype) {
  const int64_t n = backend.device() == Device::kCpu ? 1024 : 8192;
  Tensor host = Tensor::Zeros(DType::kF32, {n, n});
  for (int64_t i = 0; i < host.numel(); ++i) host.f32()[i] = static_cast<float>(i % 17 - 8) * 0.01f;
  kernels::GemmArgs args;
  LAIR_ASSIGN_OR_RETURN(args.a, backend.Upload(host, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(args.b, backend.Upload(host, weight_dtype));
  LAIR_ASSIGN_OR_RETURN(args.c, backend.Allocate(DType::kF32, {n, n}));
  LAIR_ASSIGN_OR_RETURN(double t, MedianSeconds(backend, 5, [&] { return backend.Gemm(args); }));
  return 2.0 * static_cast<double>(n) * n * n / t;
}

// A model on its backend with B state slots, and B random prompts.
struct Bench {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<models::Model> model;
  models::StatePool pool;
  models::ModelSize size;
  std::vector<int32_t> prompts;  // [B·P] packed, sequence s at s·P
};

absl::StatusOr<Bench> Setup(const BenchModelFlags& f, int max_context, bool decode) {
  Bench b;
  kernels::BackendOptions backend_options;
  LAIR_ASSIGN_OR_RETURN(backend_options.gemm, kernels::ParseGemmMode(f.gemm, "--gemm"));
  LAIR_ASSIGN_OR_RETURN(backend_options.scan,
                        kernels::ParseScanSchedule(f.scan_schedule, "--scan-schedule"));
  LAIR_ASSIGN_OR_RETURN(b.backend, kernels::MakeBackend(f.device, backend_options));
  models::LoadOptions options;
  options.step_graphs = !f.no_graphs;
  options.persistent_decode = decode && !f.no_persistent;
  options.fold_norm_weights = !f.keep_norm_weights;
  options.fuse_low_rank_gates = decode && !f.keep_low_rank_gates;
  options.weight_dtype = f.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  options.max_context = max_context;
  LAIR_ASSIGN_OR_RETURN(b.model, models::Model::Load(f.model, b.backend.get(), options));
  LAIR_ASSIGN_OR_RETURN(
      b.pool, models::StatePool::Create(b.backend.get(), b.model->state_layout(), f.batch));
  b.size = b.model->size();
  std::mt19937 rng(20261122);
  std::uniform_int_distribution<int32_t> token(0, b.model->vocab_size() - 1);
  b.prompts.resize(static_cast<size_t>(f.batch) * f.prompt_len);
  for (int32_t& t : b.prompts) t = token(rng);
  return b;
}

// Zeroes every slot, then prefills the prompts as one batch. Returns the
// logits of each sequence's last token [B, vocab]; `seconds` gets the
// forward's time (the zeroing excluded).
absl::StatusOr<Tensor> Prefill(Bench& b, const BenchModelFlags& f, double* seconds) {
  models::ForwardBatch batch;
  batch.tokens = b.prompts;
  for (int s = 0; s < f.batch; ++s) {
    LAIR_RETURN_IF_ERROR(b.pool.Zero(s));
    batch.cu_seqlens.push_back(s * f.prompt_len);
    batch.slots.push_back(s);
    batch.start_positions.push_back(0);
  }
  batch.cu_seqlens.push_back(f.batch * f.prompt_len);
  LAIR_RETURN_IF_ERROR(b.backend->Synchronize());
  const auto start = std::chrono::steady_clock::now();
  LAIR_ASSIGN_OR_RETURN(Tensor logits, b.model->Forward(batch, b.pool));
  LAIR_RETURN_IF_ERROR(b.backend->Synchronize());
  *seconds = SecondsSince(start);
  return logits;
}

void PrintHeader(const Bench& b, const BenchModelFlags& f) {
  std::printf(
      "backend %s (gemm %s); model %s: %s, %.1fM parameters, weights %.1f MB (%s matrices), "
      "state %.2f MB per sequence\n",
      b.backend->Name().c_str(), f.gemm.c_str(), f.model.c_str(), b.model->family().c_str(),
      b.size.parameters / 1e6, b.size.weight_bytes / 1e6, f.dtype.c_str(),
      b.pool.layout().BytesPerSlot() / 1e6);
}

void Row(const char* label, const std::string& value) {
  std::printf("  %-22s %s\n", label, value.c_str());
}

// snprintf into a string (the table's values are short).
template <typename... Args>
std::string Printed(const char* format, Args... args) {
  char buffer[200];
  std::snprintf(buffer, sizeof(buffer), format, args...);
  return buffer;
}

absl::Status RunDecode(const BenchModelFlags& f) {
  LAIR_RETURN_IF_ERROR(Validate(f, /*decode=*/true));
  LAIR_ASSIGN_OR_RETURN(Bench b, Setup(f, f.prompt_len + f.warmup + f.gen_len, /*decode=*/true));
  PrintHeader(b, f);
  LAIR_ASSIGN_OR_RETURN(const double copy_rate, CopyBandwidth(*b.backend));
  double prefill_seconds = 0;
  LAIR_ASSIGN_OR_RETURN(Tensor logits, Prefill(b, f, &prefill_seconds));

  models::ForwardBatch step;
  for (int s = 0; s < f.batch; ++s) {
    step.cu_seqlens.push_back(s);
    step.slots.push_back(s);
    step.start_positions.push_back(f.prompt_len);
  }
  step.cu_seqlens.push_back(f.batch);
  step.tokens = RowArgmax(logits);
  std::vector<double> step_seconds;
  for (int i = 0; i < f.warmup + f.gen_len; ++i) {
    LAIR_RETURN_IF_ERROR(b.backend->Synchronize());
    const auto start = std::chrono::steady_clock::now();
    LAIR_ASSIGN_OR_RETURN(step.tokens, b.model->ForwardGreedy(step, b.pool));
    LAIR_RETURN_IF_ERROR(b.backend->Synchronize());
    if (i >= f.warmup) step_seconds.push_back(SecondsSince(start));
    for (int32_t& position : step.start_positions) ++position;
  }

  double total = 0;
  for (double s : step_seconds) total += s;
  const double mean = total / f.gen_len;
  std::sort(step_seconds.begin(), step_seconds.end());
  const double median = step_seconds[step_seconds.size() / 2];
  const double state_bytes = 2.0 * static_cast<double>(b.pool.layout().BytesPerSlot()) * f.batch;
  const double floor_bytes = static_cast<double>(b.size.forward_weight_bytes) + state_bytes;
  const double floor_seconds = floor_bytes / copy_rate;
  const double tokens_per_second = static_cast<double>(f.batch) * f.gen_len / total;
  LAIR_ASSIGN_OR_RETURN(Tensor device_logits,
                        b.backend->Allocate(DType::kF32, {f.batch, b.model->vocab_size()}));
  LAIR_ASSIGN_OR_RETURN(const double download_seconds, MedianSeconds(*b.backend, 5, [&] {
                          return b.backend->Download(device_logits).status();
                        }));

  std::printf("batch %d, prompt %d, %d timed decode steps after %d warm-up steps\n", f.batch,
              f.prompt_len, f.gen_len, f.warmup);
  Row("prefill", Printed("%.2f ms (%.0f tokens/s)", prefill_seconds * 1e3,
                         static_cast<double>(f.batch) * f.prompt_len / prefill_seconds));
  Row("decode", Printed("%.1f tokens/s", tokens_per_second));
  Row("step mean / median", Printed("%.3f / %.3f ms", mean * 1e3, median * 1e3));
  Row("copy bandwidth", Printed("%.1f GB/s (read + write)", copy_rate / 1e9));
  Row("step bytes",
      Printed("%.1f MB = weights %.1f + state read and written %.1f", floor_bytes / 1e6,
              b.size.forward_weight_bytes / 1e6, state_bytes / 1e6));
  Row("floor time", Printed("%.3f ms", floor_seconds * 1e3));
  Row("fraction of floor", Printed("%.3f", floor_seconds / median));
  Row("graphs", f.no_graphs ? "off (op by op)"
                            : "decode steps replay CUDA graphs (where the backend has them)");
  const int64_t persistent_steps = b.model->persistent_decode_steps();
  std::string persistent = "off";
  if (persistent_steps > 0) {
    persistent = Printed("%lld of the steps", static_cast<long long>(persistent_steps));
  } else if (!f.no_persistent) {
    persistent = "not taken: " + std::string(b.model->persistent_decode_status().message());
  }
  Row("persistent kernel", persistent);
  Row("norm weights", f.keep_norm_weights ? "kept" : "folded into the products");
  Row("low-rank gates", f.keep_low_rank_gates ? "kept" : "fused for decode steps");
  Row("host logits would add",
      Printed("%.3f ms per step (download of %.2f MB)", download_seconds * 1e3,
              static_cast<double>(device_logits.nbytes()) / 1e6));
  std::printf(
      "lair bench decode: %s B=%d P=%d G=%d %s %s gemm=%s graphs=%s persistent=%s: %.1f tokens/s, "
      "%.3f ms/step (median), %.3f of the memory floor\n",
      b.model->family().c_str(), f.batch, f.prompt_len, f.gen_len, f.device.c_str(),
      f.dtype.c_str(), f.gemm.c_str(), f.no_graphs ? "off" : "on",
      persistent_steps > 0 ? "on" : "off", tokens_per_second, median * 1e3, floor_seconds / median);
  return absl::OkStatus();
}

absl::Status RunPrefill(const BenchModelFlags& f) {
  LAIR_RETURN_IF_ERROR(Validate(f, /*decode=*/false));
  LAIR_ASSIGN_OR_RETURN(Bench b, Setup(f, f.prompt_len, /*decode=*/false));
  PrintHeader(b, f);
  LAIR_ASSIGN_OR_RETURN(const double gemm_rate,
                        GemmRate(*b.backend, f.dtype == "bf16" ? DType::kBF16 : DType::kF32));
  double seconds = 0;
  for (int i = 0; i < f.warmup; ++i) LAIR_RETURN_IF_ERROR(Prefill(b, f, &seconds).status());
  LAIR_RETURN_IF_ERROR(Prefill(b, f, &seconds).status());

  int64_t state_elements = 0;
  for (const models::StateTensorSpec& spec : b.pool.layout().tensors)
    state_elements += ShapeNumel(spec.shape);
  const double tokens = static_cast<double>(f.batch) * f.prompt_len;
  const double matrix_flops = 2.0 * static_cast<double>(b.size.matrix_parameters) * tokens;
  const double head_flops = 2.0 * static_cast<double>(b.size.head_parameters) * f.batch;
  const double state_flops = 4.0 * static_cast<double>(state_elements) * tokens;
  const double flops = matrix_flops + head_flops + state_flops;
  const double fraction = flops / seconds / gemm_rate;

  std::printf("batch %d, prompt %d, one timed prefill after %d warm-up prefills\n", f.batch,
              f.prompt_len, f.warmup);
  Row("prefill", Printed("%.2f ms", seconds * 1e3));
  Row("throughput", Printed("%.0f tokens/s", tokens / seconds));
  Row("FLOPs counted", Printed("%.2f G = projections %.2f + head %.3f + state %.3f", flops / 1e9,
                               matrix_flops / 1e9, head_flops / 1e9, state_flops / 1e9));
  Row("achieved", Printed("%.1f GFLOP/s", flops / seconds / 1e9));
  Row("matmul rate", Printed("%.1f GFLOP/s (Gemm, %s weights, gemm %s)", gemm_rate / 1e9,
                             f.dtype.c_str(), f.gemm.c_str()));
  Row("fraction of matmul", Printed("%.3f", fraction));
  std::printf(
      "lair bench prefill: %s B=%d P=%d %s %s gemm=%s scan=%s: %.0f tokens/s, %.1f GFLOP/s, "
      "%.3f of the matmul rate (%.1f GFLOP/s)\n",
      b.model->family().c_str(), f.batch, f.prompt_len, f.device.c_str(), f.dtype.c_str(),
      f.gemm.c_str(), f.scan_schedule.c_str(), tokens / seconds, flops / seconds / 1e9, fraction,
      gemm_rate / 1e9);
  return absl::OkStatus();
}

// Registers `bench decode` or `bench prefill` and their shared flags.
void AddCommand(CLI::App& app, bool decode) {
  auto flags = std::make_shared<BenchModelFlags>();
  flags->warmup = decode ? 2 : 1;
  CLI::App* cmd = BenchCommand(app)->add_subcommand(
      decode ? "decode" : "prefill",
      decode ? "Greedy decode throughput of a model against its memory floor"
             : "Prefill throughput of a model against the measured matmul rate");
  cmd->add_option("--model", flags->model, "Model folder (config.json and weights)")->required();
  cmd->add_option("--device", flags->device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", flags->dtype, "Weight matrices: f32 or bf16 (CUDA)")
      ->capture_default_str();
  cmd->add_option("--gemm", flags->gemm, "Matrix products: fast (tensor cores) or exact (fp32)")
      ->capture_default_str();
  if (decode) cmd->add_flag("--no-graphs", flags->no_graphs, "Run every decode step op by op");
  if (decode)
    cmd->add_flag("--no-persistent", flags->no_persistent,
                  "Run one-sequence decode steps on the step graphs, not the persistent kernel");
  cmd->add_flag("--keep-norm-weights", flags->keep_norm_weights,
                "Load the norms' weights as they are (no folding into the products)");
  if (decode)
    cmd->add_flag("--keep-low-rank-gates", flags->keep_low_rank_gates,
                  "Decode low-rank gates through their two products (no fused weight)");
  cmd->add_option("--batch", flags->batch, "Sequences B")->capture_default_str();
  cmd->add_option("--prompt-len", flags->prompt_len, "Prompt tokens P per sequence")->required();
  if (decode) cmd->add_option("--gen-len", flags->gen_len, "Timed decode steps G")->required();
  cmd->add_option("--warmup", flags->warmup, decode ? "Untimed decode steps" : "Untimed prefills")
      ->capture_default_str();
  cmd->add_option("--scan-schedule", flags->scan_schedule,
                  "Chunked scans on the tensor cores: auto, one-pass, two-pass or segmented")
      ->capture_default_str();
  cmd->callback([flags, decode] {
    const absl::Status status = decode ? RunDecode(*flags) : RunPrefill(*flags);
    if (!status.ok()) {
      std::fprintf(stderr, "lair bench %s: %s\n", decode ? "decode" : "prefill",
                   std::string(status.message()).c_str());
      SetExitCode(absl::IsUnimplemented(status) ? 2 : 1);
    }
  });
}

}  // namespace

LAIR_REGISTER_COMMAND(bench_model, [](CLI::App& app) {
  AddCommand(app, /*decode=*/true);
  AddCommand(app, /*decode=*/false);
});

}  // namespace lair::cli
