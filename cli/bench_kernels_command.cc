// `lair bench kernels`: the mixer kernels at training/prefill scale and the
// decode step, on a GPU backend, in the units the references are quoted in.
//
// Chunked ops run B·T = --tokens packed tokens (B sequences of T each, T from
// --seq-lens) with H = --heads, K = V = --dim, bf16 activations, fp32 gates
// and states, from a zero initial state: GLA (vector decay), simple GLA
// (scalar decay), GSA (--slots slots), mLSTM exp and sig (--ops picks some of
// gla, simple_gla, gsa, mlstm_exp, mlstm_sig; --modes some of fwd, fwdbwd).
// mlstm_sig is the normalized sigmoid kind (MlstmKind::kSigNorm), as TFLA's
// xl_chunk_siging computes by default.
// Each prints the median milliseconds of the forward and of forward + backward.
// --scan-schedule forces the tensor-core scans' schedule (kernels::ScanSchedule).
// The decode step runs B ∈ --decode-batches one-token sequences with their
// states in slots and reports state bytes moved (read + write) per second,
// against the device-to-device copy bandwidth measured in the same run. Each
// step is followed by a 4-byte copy, as LaunchStep requires between two steps
// of one state (scan.h: a step reads its states before the kernel before it
// completes); the copy's own time, measured alone, is subtracted.
//
// Output lines (parsed by scripts/gpu-check.sh):
//   lair copy_bandwidth <GB/s>
//   lair <op> T=<T> <fwd|fwdbwd> <ms>            or  ... UNSUPPORTED <reason>
//   lair step_<op> B=<B> <us> <GB/s> <fraction of copy>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/bench_command.h"
#include "cli/command_registry.h"
#include "kernels/backend.h"

namespace lair::cli {
namespace {

struct BenchKernelsFlags {
  std::string device = "cuda";
  int64_t tokens = 65536;
  int heads = 16;
  int dim = 128;
  int slots = 64;
  std::vector<int> seq_lens = {1024, 4096, 16384};
  std::vector<int> decode_batches = {1, 32, 256};
  std::vector<std::string> ops = {"gla", "simple_gla", "gsa", "mlstm_exp", "mlstm_sig"};
  std::vector<std::string> modes = {"fwd", "fwdbwd"};
  int reps = 7;
  std::string scan_schedule = "auto";  // kernels::ScanSchedule

  bool Wants(const std::vector<std::string>& list, const std::string& name) const {
    return std::find(list.begin(), list.end(), name) != list.end();
  }
};

// Uniform random host data (xorshift: fast enough for 10⁸ values).
class Random {
 public:
  explicit Random(uint64_t seed) : x_(seed | 1) {}
  Tensor Uniform(Shape shape, float lo, float hi) {
    Tensor t = Tensor::Zeros(DType::kF32, std::move(shape));
    float* p = t.f32();
    for (int64_t i = 0; i < t.numel(); ++i) {
      x_ ^= x_ << 13;
      x_ ^= x_ >> 7;
      x_ ^= x_ << 17;
      p[i] = lo + (hi - lo) * static_cast<float>(x_ >> 40) * (1.0f / 16777216.0f);
    }
    return t;
  }

 private:
  uint64_t x_;
};

// Median seconds per call over `reps` timed rounds of `calls` calls each,
// after one untimed call; each round ends with Synchronize.
absl::StatusOr<double> Time(kernels::Backend& backend, int reps, int calls,
                            const std::function<absl::Status()>& call) {
  LAIR_RETURN_IF_ERROR(call());
  LAIR_RETURN_IF_ERROR(backend.Synchronize());
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) LAIR_RETURN_IF_ERROR(call());
    LAIR_RETURN_IF_ERROR(backend.Synchronize());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

void PrintTime(const std::string& label, const absl::StatusOr<double>& t) {
  if (t.ok()) {
    std::printf("lair %s %.3f\n", label.c_str(), *t * 1e3);
  } else {
    std::printf("lair %s UNSUPPORTED %s\n", label.c_str(),
                std::string(t.status().message()).c_str());
  }
  std::fflush(stdout);
}

// The packed batch of `num_seqs` sequences of `len` tokens, sequence s in slot
// s, with device copies of the offsets and slots (as the engine keeps them).
struct Batch {
  std::vector<int32_t> offsets, slots;
  Tensor offsets_device, slots_device;
  kernels::SequenceBatch View() const {
    kernels::SequenceBatch b;
    b.num_seqs = static_cast<int>(slots.size());
    b.cu_seqlens = offsets;
    b.state_slot = slots;
    b.cu_seqlens_device = offsets_device.data<int32_t>();
    b.state_slot_device = slots_device.data<int32_t>();
    b.zero_initial_state = true;
    b.max_seqlen = offsets.size() > 1 ? offsets[1] : 0;
    return b;
  }
};

absl::StatusOr<Batch> MakeBatch(kernels::Backend& backend, int num_seqs, int len) {
  Batch b;
  for (int s = 0; s <= num_seqs; ++s) b.offsets.push_back(s * len);
  for (int s = 0; s < num_seqs; ++s) b.slots.push_back(s);
  auto upload = [&](const std::vector<int32_t>& values) {
    Tensor host = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), host.data<int32_t>());
    return backend.Upload(host, DType::kI32);
  };
  LAIR_ASSIGN_OR_RETURN(b.offsets_device, upload(b.offsets));
  LAIR_ASSIGN_OR_RETURN(b.slots_device, upload(b.slots));
  return b;
}

absl::Status Run(const BenchKernelsFlags& f) {
  kernels::BackendOptions options;
  LAIR_ASSIGN_OR_RETURN(options.scan,
                        kernels::ParseScanSchedule(f.scan_schedule, "--scan-schedule"));
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> be,
                        kernels::MakeBackend(f.device, options));
  kernels::Backend& backend = *be;
  std::printf("lair device %s\n", backend.Name().c_str());
  Random rng(20261122);
  const int64_t n = f.tokens;
  const int H = f.heads, D = f.dim, M = f.slots;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // Copy bandwidth: 1 GiB device-to-device, bytes read + written.
  double copy_gbs = 0;
  {
    LAIR_ASSIGN_OR_RETURN(Tensor a, backend.Upload(rng.Uniform({1 << 28}, -1, 1), DType::kF32));
    LAIR_ASSIGN_OR_RETURN(Tensor b, backend.Allocate(DType::kF32, {1 << 28}));
    LAIR_ASSIGN_OR_RETURN(double t, Time(backend, f.reps, 5, [&] { return backend.Copy(a, b); }));
    copy_gbs = 2.0 * a.nbytes() / t / 1e9;
    std::printf("lair copy_bandwidth %.1f\n", copy_gbs);
  }
  std::fflush(stdout);

  // One set of inputs serves every T (the token count is fixed).
  auto up = [&](Shape shape, float lo, float hi, DType dt) {
    return backend.Upload(rng.Uniform(std::move(shape), lo, hi), dt);
  };
  LAIR_ASSIGN_OR_RETURN(Tensor q, up({n, H, D}, -1, 1, DType::kBF16));
  LAIR_ASSIGN_OR_RETURN(Tensor k, up({n, H, D}, -1, 1, DType::kBF16));
  LAIR_ASSIGN_OR_RETURN(Tensor v, up({n, H, D}, -1, 1, DType::kBF16));
  LAIR_ASSIGN_OR_RETURN(Tensor d_o, up({n, H, D}, -1, 1, DType::kBF16));
  LAIR_ASSIGN_OR_RETURN(Tensor gk, up({n, H, D}, -0.2f, 0, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(Tensor g, up({n, H}, -0.2f, 0, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(Tensor gs, up({n, H, M}, -0.2f, 0, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(Tensor ss, up({n, H, M}, 0, 0.2f, DType::kBF16));
  LAIR_ASSIGN_OR_RETURN(Tensor ig, up({n, H}, -2, 2, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(Tensor fg, up({n, H}, 2, 5, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(Tensor o, backend.Allocate(DType::kBF16, {n, H, D}));
  LAIR_ASSIGN_OR_RETURN(Tensor dq, backend.Allocate(DType::kBF16, {n, H, D}));
  LAIR_ASSIGN_OR_RETURN(Tensor dk, backend.Allocate(DType::kBF16, {n, H, D}));
  LAIR_ASSIGN_OR_RETURN(Tensor dv, backend.Allocate(DType::kBF16, {n, H, D}));
  LAIR_ASSIGN_OR_RETURN(Tensor dgk, backend.Allocate(DType::kF32, {n, H, D}));
  LAIR_ASSIGN_OR_RETURN(Tensor dg, backend.Allocate(DType::kF32, {n, H}));
  LAIR_ASSIGN_OR_RETURN(Tensor di, backend.Allocate(DType::kF32, {n, H}));
  LAIR_ASSIGN_OR_RETURN(Tensor df, backend.Allocate(DType::kF32, {n, H}));

  for (int T : f.seq_lens) {
    const int B = static_cast<int>(n / T);
    LAIR_ASSIGN_OR_RETURN(const Batch batch, MakeBatch(backend, B, T));
    const kernels::SequenceBatch sb = batch.View();
    LAIR_ASSIGN_OR_RETURN(Tensor state, backend.Allocate(DType::kF32, {B, H, D, D}));
    const std::string at = " T=" + std::to_string(T);

    for (const bool vector : {true, false}) {
      kernels::DecayForwardArgs a;
      a.kind = vector ? kernels::DecayKind::kVector : kernels::DecayKind::kScalar;
      a.heads = H;
      a.key_dim = a.value_dim = D;
      a.scale = scale;
      a.q = q, a.k = k, a.v = v, a.o = o, a.state = state;
      if (vector)
        a.gk = gk;
      else
        a.g = g;
      kernels::DecayBackwardArgs b;
      b.fwd = a;
      b.d_o = d_o, b.dq = dq, b.dk = dk, b.dv = dv;
      if (vector)
        b.dgk = dgk;
      else
        b.dg = dg;
      auto fwd = [&] { return backend.DecayForward(sb, a, kernels::MixerForm::kChunked); };
      const std::string name = vector ? "gla" : "simple_gla";
      if (!f.Wants(f.ops, name)) continue;
      if (f.Wants(f.modes, "fwd")) PrintTime(name + at + " fwd", Time(backend, f.reps, 1, fwd));
      if (f.Wants(f.modes, "fwdbwd"))
        PrintTime(name + at + " fwdbwd", Time(backend, f.reps, 1, [&] {
                    LAIR_RETURN_IF_ERROR(fwd());
                    return backend.DecayBackward(sb, b);
                  }));
    }
    if (f.Wants(f.ops, "gsa")) {
      LAIR_ASSIGN_OR_RETURN(Tensor hk, backend.Allocate(DType::kF32, {B, H, D, M}));
      LAIR_ASSIGN_OR_RETURN(Tensor hv, backend.Allocate(DType::kF32, {B, H, M, D}));
      kernels::GsaForwardArgs a;
      a.heads = H, a.key_dim = D, a.value_dim = D, a.num_slots_m = M, a.scale = scale;
      a.q = q, a.k = k, a.v = v, a.s = ss, a.g = gs, a.o = o, a.state_k = hk, a.state_v = hv;
      kernels::GsaBackwardArgs b;
      b.fwd = a;
      LAIR_ASSIGN_OR_RETURN(b.ds, backend.Allocate(DType::kBF16, {n, H, M}));
      LAIR_ASSIGN_OR_RETURN(b.dg, backend.Allocate(DType::kF32, {n, H, M}));
      b.d_o = d_o, b.dq = dq, b.dk = dk, b.dv = dv;
      auto fwd = [&] { return backend.GsaForward(sb, a, kernels::MixerForm::kChunked); };
      if (f.Wants(f.modes, "fwd")) PrintTime("gsa" + at + " fwd", Time(backend, f.reps, 1, fwd));
      if (f.Wants(f.modes, "fwdbwd"))
        PrintTime("gsa" + at + " fwdbwd", Time(backend, f.reps, 1, [&] {
                    LAIR_RETURN_IF_ERROR(fwd());
                    return backend.GsaBackward(sb, b);
                  }));
    }
    LAIR_ASSIGN_OR_RETURN(Tensor cn, backend.Allocate(DType::kF32, {B, H, D}));
    LAIR_ASSIGN_OR_RETURN(Tensor cm, backend.Allocate(DType::kF32, {B, H}));
    for (const bool exp_gate : {true, false}) {
      kernels::MlstmForwardArgs a;
      a.kind = exp_gate ? kernels::MlstmKind::kExp : kernels::MlstmKind::kSigNorm;
      a.heads = H, a.key_dim = D, a.value_dim = D;
      a.q = q, a.k = k, a.v = v, a.i = ig, a.f = fg, a.h = o;
      a.state_c = state, a.state_n = cn, a.state_m = cm;
      const std::string name = exp_gate ? "mlstm_exp" : "mlstm_sig";
      if (!f.Wants(f.ops, name)) continue;
      // A training forward keeps q'·n for its backward (MlstmForwardArgs::norm_dot).
      kernels::MlstmBackwardArgs b;
      b.fwd = a;
      LAIR_ASSIGN_OR_RETURN(b.fwd.norm_dot, backend.Allocate(DType::kF32, {n, H}));
      b.d_h = d_o, b.dq = dq, b.dk = dk, b.dv = dv, b.di = di, b.df = df;
      auto fwd = [&] { return backend.MlstmForward(sb, a, kernels::MixerForm::kChunked); };
      if (f.Wants(f.modes, "fwd")) PrintTime(name + at + " fwd", Time(backend, f.reps, 1, fwd));
      if (f.Wants(f.modes, "fwdbwd"))
        PrintTime(
            name + at + " fwdbwd", Time(backend, f.reps, 1, [&] {
              LAIR_RETURN_IF_ERROR(backend.MlstmForward(sb, b.fwd, kernels::MixerForm::kChunked));
              return backend.MlstmBackward(sb, b);
            }));
    }
  }

  // Decode step: B one-token sequences, states in place in their slots.
  LAIR_ASSIGN_OR_RETURN(Tensor word, backend.Allocate(DType::kF32, {2}));
  const Tensor word_from = word.Rows(0, 1), word_to = word.Rows(1, 2);
  const auto separate = [&] { return backend.Copy(word_from, word_to); };
  LAIR_ASSIGN_OR_RETURN(const double separator_seconds, Time(backend, f.reps, 50, separate));
  for (int B : f.decode_batches) {
    LAIR_ASSIGN_OR_RETURN(const Batch batch, MakeBatch(backend, B, 1));
    kernels::SequenceBatch sb = batch.View();
    sb.zero_initial_state = false;
    LAIR_ASSIGN_OR_RETURN(Tensor state, up({B, H, D, D}, -1, 1, DType::kF32));
    for (const bool vector : {true, false}) {
      kernels::DecayForwardArgs a;
      a.kind = vector ? kernels::DecayKind::kVector : kernels::DecayKind::kScalar;
      a.heads = H, a.key_dim = D, a.value_dim = D, a.scale = scale;
      a.q = q.Rows(0, B), a.k = k.Rows(0, B), a.v = v.Rows(0, B), a.o = o.Rows(0, B);
      a.state = state;
      if (vector)
        a.gk = gk.Rows(0, B);
      else
        a.g = g.Rows(0, B);
      absl::StatusOr<double> t = Time(backend, f.reps, 50, [&] {
        LAIR_RETURN_IF_ERROR(backend.DecayForward(sb, a, kernels::MixerForm::kRecurrent));
        return separate();
      });
      if (t.ok()) *t -= separator_seconds;
      const std::string name = vector ? "step_gla" : "step_simple_gla";
      if (!t.ok()) {
        std::printf("lair %s B=%d UNSUPPORTED %s\n", name.c_str(), B,
                    std::string(t.status().message()).c_str());
        continue;
      }
      const double gbs = 2.0 * state.nbytes() / *t / 1e9;
      std::printf("lair %s B=%d %.2f %.1f %.3f\n", name.c_str(), B, *t * 1e6, gbs,
                  copy_gbs > 0 ? gbs / copy_gbs : 0.0);
    }
  }
  return absl::OkStatus();
}

}  // namespace

LAIR_REGISTER_COMMAND(bench_kernels, [](CLI::App& app) {
  auto flags = std::make_shared<BenchKernelsFlags>();
  CLI::App* cmd = BenchCommand(app)->add_subcommand(
      "kernels", "Time the GPU mixer kernels (prefill, training, decode step)");
  cmd->add_option("--device", flags->device, "Backend (cuda or cuda:N)")->capture_default_str();
  cmd->add_option("--tokens", flags->tokens, "Packed tokens per launch (B·T)")
      ->capture_default_str();
  cmd->add_option("--heads", flags->heads, "Heads")->capture_default_str();
  cmd->add_option("--dim", flags->dim, "K = V")->capture_default_str();
  cmd->add_option("--slots", flags->slots, "GSA slots")->capture_default_str();
  cmd->add_option("--seq-lens", flags->seq_lens, "Sequence lengths T")->capture_default_str();
  cmd->add_option("--decode-batches", flags->decode_batches, "Decode batch sizes")
      ->capture_default_str();
  cmd->add_option("--ops", flags->ops, "Chunked ops to time")->capture_default_str();
  cmd->add_option("--modes", flags->modes, "fwd and/or fwdbwd")->capture_default_str();
  cmd->add_option("--reps", flags->reps, "Timed rounds (median)")->capture_default_str();
  cmd->add_option("--scan-schedule", flags->scan_schedule,
                  "Chunked scans on the tensor cores: auto, one-pass, two-pass or segmented")
      ->capture_default_str();
  cmd->callback([flags] {
    const absl::Status status = Run(*flags);
    if (!status.ok()) {
      std::fprintf(stderr, "bench kernels: %s\n", std::string(status.message()).c_str());
      SetExitCode(absl::IsUnimplemented(status) ? 2 : 1);
    }
  });
});

}  // namespace lair::cli
