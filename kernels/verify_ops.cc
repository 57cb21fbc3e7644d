#include "kernels/verify_ops.h"

#include <cmath>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "nlohmann/json.hpp"

namespace lair::kernels {
namespace {

struct FormCase {
  MixerForm form;
  const char* label;
};
constexpr FormCase kForms[] = {{MixerForm::kChunked, "chunked"},
                               {MixerForm::kRecurrent, "recurrent"}};

// Runs one op: fixture access, uploads, and comparisons into the report.
class OpRunner {
 public:
  OpRunner(Backend& backend, std::shared_ptr<const SafetensorsFile> file,
           const VerifyOpsOptions& options, OpReport& report)
      : backend_(backend), file_(std::move(file)), options_(options), report_(report) {}

  bool Has(std::string_view name) const { return file_->Contains(name); }

  // A fixture tensor as an F32 host copy (the mapping is read-only).
  absl::StatusOr<Tensor> Host(std::string_view name) const {
    LAIR_ASSIGN_OR_RETURN(Tensor t, file_->Get(name));
    return t.ToF32();
  }

  // The shape of a fixture tensor, checked for rank.
  absl::StatusOr<Shape> ShapeOf(std::string_view name, int rank) const {
    LAIR_ASSIGN_OR_RETURN(Tensor t, file_->Get(name));
    if (t.rank() != rank) {
      return absl::InvalidArgumentError(absl::StrCat("fixture tensor ", std::string(name),
                                                     " has shape ", ShapeString(t.shape()),
                                                     ", expected rank ", rank));
    }
    return t.shape();
  }

  // Uploads fixture tensor `name`, which must have shape `fixture_shape`, as
  // `dtype` in the packed shape `shape`.
  absl::StatusOr<Tensor> Input(std::string_view name, const Shape& fixture_shape,
                               const Shape& shape, DType dtype) {
    LAIR_ASSIGN_OR_RETURN(Tensor host, Host(name));
    LAIR_RETURN_IF_ERROR(
        ExpectShape(host, fixture_shape, absl::StrCat("fixture tensor ", std::string(name))));
    if (options_.rounded_in_f32 && dtype != DType::kF32) {
      return backend_.Upload(RoundedTo(host, dtype).Reshape(shape), DType::kF32);
    }
    return backend_.Upload(host.Reshape(shape), dtype);
  }

  absl::StatusOr<Tensor> Output(DType dtype, const Shape& shape) {
    return backend_.Allocate(options_.rounded_in_f32 ? DType::kF32 : dtype, shape);
  }

  // Compares `ours` (on the backend) with fixture tensor `ref` and records it.
  absl::Status Compare(std::string_view label, const Tensor& ours, std::string_view ref,
                       double tolerance) {
    LAIR_ASSIGN_OR_RETURN(Tensor expected, Host(ref));
    LAIR_ASSIGN_OR_RETURN(Tensor got, backend_.Download(ours));
    if (got.numel() != expected.numel()) {
      return absl::InternalError(absl::StrCat(std::string(label), ": ", got.DebugString(),
                                              " vs fixture ", expected.DebugString()));
    }
    Tensor values = got.ToF32();
    const double error = RelativeError(values, expected);
    report_.checks.push_back({std::string(label), error, tolerance, std::move(values)});
    return absl::OkStatus();
  }

  // B sequences of T tokens, sequence b in slot b.
  absl::StatusOr<SequenceBatch> Batch(int64_t b, int64_t t) {
    cu_seqlens_.assign(b + 1, 0);
    slots_.assign(b, 0);
    for (int64_t s = 0; s < b; ++s) {
      cu_seqlens_[s + 1] = static_cast<int32_t>((s + 1) * t);
      slots_[s] = static_cast<int32_t>(s);
    }
    SequenceBatch batch;
    batch.num_seqs = static_cast<int>(b);
    batch.cu_seqlens = cu_seqlens_;
    batch.state_slot = slots_;
    batch.max_seqlen = static_cast<int>(t);
    if (backend_.device() == Device::kCuda) {
      LAIR_ASSIGN_OR_RETURN(cu_seqlens_device_,
                            backend_.Upload(IntTensor(cu_seqlens_), DType::kI32));
      LAIR_ASSIGN_OR_RETURN(slots_device_, backend_.Upload(IntTensor(slots_), DType::kI32));
      batch.cu_seqlens_device = cu_seqlens_device_.data<int32_t>();
      batch.state_slot_device = slots_device_.data<int32_t>();
    }
    return batch;
  }

  Backend& backend() { return backend_; }
  DType act() const { return options_.dtype; }
  int chunk_size() const { return options_.chunk_size; }
  double out_tol() const { return OutputTolerance(options_.dtype); }
  double grad_tol() const { return GradientTolerance(options_.dtype); }

 private:
  // An F32 host tensor with every element rounded to `dtype` (BF16 or F16).
  static Tensor RoundedTo(const Tensor& f32, DType dtype) {
    Tensor out = f32.Clone();
    float* x = out.f32();
    for (int64_t i = 0; i < out.numel(); ++i) {
      x[i] = dtype == DType::kBF16 ? BF16ToFloat(FloatToBF16(x[i])) : F16ToFloat(FloatToF16(x[i]));
    }
    return out;
  }

  static Tensor IntTensor(const std::vector<int32_t>& values) {
    Tensor t = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), t.data<int32_t>());
    return t;
  }

  Backend& backend_;
  std::shared_ptr<const SafetensorsFile> file_;
  const VerifyOpsOptions& options_;
  OpReport& report_;
  std::vector<int32_t> cu_seqlens_, slots_;
  Tensor cu_seqlens_device_, slots_device_;
};

float ScaleFor(const OpSpec& spec, int64_t key_dim) {
  return spec.scale > 0 ? spec.scale
                        : static_cast<float>(1.0 / std::sqrt(static_cast<double>(key_dim)));
}

// --- Decay family -------------------------------------------------------------

absl::StatusOr<DecayKind> DecayKindOf(std::string_view kind) {
  if (kind == "no_decay") return DecayKind::kNone;
  if (kind == "constant_decay") return DecayKind::kConstant;
  if (kind == "scalar_decay") return DecayKind::kScalar;
  if (kind == "vector_decay") return DecayKind::kVector;
  if (kind == "left_right_decay") return DecayKind::kLeftRight;
  return absl::InvalidArgumentError(
      absl::StrCat("kind: unknown op kind \"", std::string(kind), "\""));
}

absl::Status RunDecay(OpRunner& r, const OpSpec& spec) {
  LAIR_ASSIGN_OR_RETURN(const DecayKind kind, DecayKindOf(spec.kind));
  LAIR_ASSIGN_OR_RETURN(const Shape qs, r.ShapeOf("q", 4));
  LAIR_ASSIGN_OR_RETURN(const Shape vs, r.ShapeOf("v", 4));
  const int64_t B = qs[0], T = qs[1], H = qs[2], K = qs[3], V = vs[3], N = B * T;
  LAIR_ASSIGN_OR_RETURN(const SequenceBatch batch, r.Batch(B, T));
  const Shape state_shape = {B, H, K, V};

  DecayForwardArgs base;
  base.kind = kind;
  base.heads = static_cast<int>(H);
  base.key_dim = static_cast<int>(K);
  base.value_dim = static_cast<int>(V);
  base.scale = ScaleFor(spec, K);
  base.chunk_size = r.chunk_size();
  LAIR_ASSIGN_OR_RETURN(base.q, r.Input("q", {B, T, H, K}, {N, H, K}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.k, r.Input("k", {B, T, H, K}, {N, H, K}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.v, r.Input("v", {B, T, H, V}, {N, H, V}, r.act()));
  if (kind == DecayKind::kConstant) {
    LAIR_ASSIGN_OR_RETURN(base.log_gamma, r.Input("log_gamma", {H}, {H}, DType::kF32));
  }
  if (kind == DecayKind::kScalar) {
    LAIR_ASSIGN_OR_RETURN(base.g, r.Input("g", {B, T, H}, {N, H}, DType::kF32));
  }
  if (kind == DecayKind::kVector || kind == DecayKind::kLeftRight) {
    LAIR_ASSIGN_OR_RETURN(base.gk, r.Input("gk", {B, T, H, K}, {N, H, K}, DType::kF32));
  }
  if (kind == DecayKind::kLeftRight) {
    LAIR_ASSIGN_OR_RETURN(base.gv, r.Input("gv", {B, T, H, V}, {N, H, V}, DType::kF32));
  }

  for (const FormCase& form : kForms) {
    DecayForwardArgs args = base;
    LAIR_ASSIGN_OR_RETURN(args.o, r.Output(r.act(), {N, H, V}));
    LAIR_ASSIGN_OR_RETURN(args.state, r.Input("h0", state_shape, state_shape, DType::kF32));
    LAIR_RETURN_IF_ERROR(r.backend().DecayForward(batch, args, form.form));
    LAIR_RETURN_IF_ERROR(r.backend().Synchronize());
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat(form.label, " o"), args.o, "o", r.out_tol()));
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat(form.label, " ht"), args.state, "ht", r.out_tol()));
  }

  DecayBackwardArgs args;
  args.fwd = base;
  LAIR_ASSIGN_OR_RETURN(args.fwd.state, r.Input("h0", state_shape, state_shape, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(args.fwd.o, r.Input("o", {B, T, H, V}, {N, H, V}, r.act()));
  LAIR_ASSIGN_OR_RETURN(args.d_o, r.Input("do", {B, T, H, V}, {N, H, V}, r.act()));
  if (r.Has("dht")) {
    LAIR_ASSIGN_OR_RETURN(args.d_ht, r.Input("dht", state_shape, state_shape, DType::kF32));
  }
  LAIR_ASSIGN_OR_RETURN(args.dq, r.Output(r.act(), {N, H, K}));
  LAIR_ASSIGN_OR_RETURN(args.dk, r.Output(r.act(), {N, H, K}));
  LAIR_ASSIGN_OR_RETURN(args.dv, r.Output(r.act(), {N, H, V}));
  // Gate and state gradients are requested only where the fixture has them.
  std::vector<std::pair<std::string, Tensor*>> checked = {
      {"dq", &args.dq}, {"dk", &args.dk}, {"dv", &args.dv}};
  if (r.Has("dh0")) {
    LAIR_ASSIGN_OR_RETURN(args.dh0, r.Output(DType::kF32, state_shape));
    checked.push_back({"dh0", &args.dh0});
  }
  if (kind == DecayKind::kConstant && r.Has("dlog_gamma")) {
    LAIR_ASSIGN_OR_RETURN(args.d_log_gamma, r.Output(DType::kF32, {H}));
    checked.push_back({"dlog_gamma", &args.d_log_gamma});
  }
  if (kind == DecayKind::kScalar && r.Has("dg")) {
    LAIR_ASSIGN_OR_RETURN(args.dg, r.Output(DType::kF32, {N, H}));
    checked.push_back({"dg", &args.dg});
  }
  if ((kind == DecayKind::kVector || kind == DecayKind::kLeftRight) && r.Has("dgk")) {
    LAIR_ASSIGN_OR_RETURN(args.dgk, r.Output(DType::kF32, {N, H, K}));
    checked.push_back({"dgk", &args.dgk});
  }
  if (kind == DecayKind::kLeftRight && r.Has("dgv")) {
    LAIR_ASSIGN_OR_RETURN(args.dgv, r.Output(DType::kF32, {N, H, V}));
    checked.push_back({"dgv", &args.dgv});
  }
  LAIR_RETURN_IF_ERROR(r.backend().DecayBackward(batch, args));
  LAIR_RETURN_IF_ERROR(r.backend().Synchronize());
  for (const auto& [name, tensor] : checked) {
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat("backward ", name), *tensor, name, r.grad_tol()));
  }
  return absl::OkStatus();
}

// --- Gated slot attention -----------------------------------------------------

absl::Status RunGsa(OpRunner& r, const OpSpec& spec) {
  LAIR_ASSIGN_OR_RETURN(const Shape qs, r.ShapeOf("q", 4));
  LAIR_ASSIGN_OR_RETURN(const Shape vs, r.ShapeOf("v", 4));
  LAIR_ASSIGN_OR_RETURN(const Shape ss, r.ShapeOf("s", 4));
  const int64_t B = qs[0], T = qs[1], H = qs[2], K = qs[3], V = vs[3], M = ss[3], N = B * T;
  LAIR_ASSIGN_OR_RETURN(const SequenceBatch batch, r.Batch(B, T));
  const Shape hk_shape = {B, H, K, M}, hv_shape = {B, H, M, V};

  GsaForwardArgs base;
  base.heads = static_cast<int>(H);
  base.key_dim = static_cast<int>(K);
  base.value_dim = static_cast<int>(V);
  base.num_slots_m = static_cast<int>(M);
  base.scale = ScaleFor(spec, K);
  base.chunk_size = r.chunk_size();
  LAIR_ASSIGN_OR_RETURN(base.q, r.Input("q", {B, T, H, K}, {N, H, K}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.k, r.Input("k", {B, T, H, K}, {N, H, K}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.v, r.Input("v", {B, T, H, V}, {N, H, V}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.s, r.Input("s", {B, T, H, M}, {N, H, M}, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(base.g, r.Input("g", {B, T, H, M}, {N, H, M}, DType::kF32));

  for (const FormCase& form : kForms) {
    GsaForwardArgs args = base;
    LAIR_ASSIGN_OR_RETURN(args.o, r.Output(r.act(), {N, H, V}));
    LAIR_ASSIGN_OR_RETURN(args.state_k, r.Input("hk0", hk_shape, hk_shape, DType::kF32));
    LAIR_ASSIGN_OR_RETURN(args.state_v, r.Input("hv0", hv_shape, hv_shape, DType::kF32));
    LAIR_RETURN_IF_ERROR(r.backend().GsaForward(batch, args, form.form));
    LAIR_RETURN_IF_ERROR(r.backend().Synchronize());
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat(form.label, " o"), args.o, "o", r.out_tol()));
    LAIR_RETURN_IF_ERROR(
        r.Compare(absl::StrCat(form.label, " hkt"), args.state_k, "hkt", r.out_tol()));
    LAIR_RETURN_IF_ERROR(
        r.Compare(absl::StrCat(form.label, " hvt"), args.state_v, "hvt", r.out_tol()));
  }

  GsaBackwardArgs args;
  args.fwd = base;
  LAIR_ASSIGN_OR_RETURN(args.fwd.state_k, r.Input("hk0", hk_shape, hk_shape, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(args.fwd.state_v, r.Input("hv0", hv_shape, hv_shape, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(args.fwd.o, r.Input("o", {B, T, H, V}, {N, H, V}, r.act()));
  LAIR_ASSIGN_OR_RETURN(args.d_o, r.Input("do", {B, T, H, V}, {N, H, V}, r.act()));
  if (r.Has("dhkt")) {
    LAIR_ASSIGN_OR_RETURN(args.d_hkt, r.Input("dhkt", hk_shape, hk_shape, DType::kF32));
  }
  if (r.Has("dhvt")) {
    LAIR_ASSIGN_OR_RETURN(args.d_hvt, r.Input("dhvt", hv_shape, hv_shape, DType::kF32));
  }
  LAIR_ASSIGN_OR_RETURN(args.dq, r.Output(r.act(), {N, H, K}));
  LAIR_ASSIGN_OR_RETURN(args.dk, r.Output(r.act(), {N, H, K}));
  LAIR_ASSIGN_OR_RETURN(args.dv, r.Output(r.act(), {N, H, V}));
  LAIR_ASSIGN_OR_RETURN(args.ds, r.Output(DType::kF32, {N, H, M}));
  LAIR_ASSIGN_OR_RETURN(args.dg, r.Output(DType::kF32, {N, H, M}));
  std::vector<std::pair<std::string, Tensor*>> checked = {
      {"dq", &args.dq}, {"dk", &args.dk}, {"dv", &args.dv}, {"ds", &args.ds}, {"dg", &args.dg}};
  if (r.Has("dhk0")) {
    LAIR_ASSIGN_OR_RETURN(args.d_hk0, r.Output(DType::kF32, hk_shape));
    checked.push_back({"dhk0", &args.d_hk0});
  }
  if (r.Has("dhv0")) {
    LAIR_ASSIGN_OR_RETURN(args.d_hv0, r.Output(DType::kF32, hv_shape));
    checked.push_back({"dhv0", &args.d_hv0});
  }
  LAIR_RETURN_IF_ERROR(r.backend().GsaBackward(batch, args));
  LAIR_RETURN_IF_ERROR(r.backend().Synchronize());
  for (const auto& [name, tensor] : checked) {
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat("backward ", name), *tensor, name, r.grad_tol()));
  }
  return absl::OkStatus();
}

// --- mLSTM --------------------------------------------------------------------

absl::Status RunMlstm(OpRunner& r, const OpSpec& spec, MlstmKind kind) {
  LAIR_ASSIGN_OR_RETURN(const Shape qs, r.ShapeOf("q", 4));
  LAIR_ASSIGN_OR_RETURN(const Shape vs, r.ShapeOf("v", 4));
  const int64_t B = qs[0], T = qs[1], H = qs[2], K = qs[3], V = vs[3], N = B * T;
  LAIR_ASSIGN_OR_RETURN(const SequenceBatch batch, r.Batch(B, T));
  const Shape c_shape = {B, H, K, V}, n_shape = {B, H, K}, m_shape = {B, H};
  const bool stabilized = kind == MlstmKind::kExp;

  MlstmForwardArgs base;
  base.kind = kind;
  base.heads = static_cast<int>(H);
  base.key_dim = static_cast<int>(K);
  base.value_dim = static_cast<int>(V);
  base.eps = spec.eps;
  base.chunk_size = r.chunk_size();
  LAIR_ASSIGN_OR_RETURN(base.q, r.Input("q", {B, T, H, K}, {N, H, K}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.k, r.Input("k", {B, T, H, K}, {N, H, K}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.v, r.Input("v", {B, T, H, V}, {N, H, V}, r.act()));
  LAIR_ASSIGN_OR_RETURN(base.i, r.Input("i", {B, T, H}, {N, H}, DType::kF32));
  LAIR_ASSIGN_OR_RETURN(base.f, r.Input("f", {B, T, H}, {N, H}, DType::kF32));

  // Fresh initial states for one call (the pools are updated in place).
  auto load_states = [&](MlstmForwardArgs& args) -> absl::Status {
    LAIR_ASSIGN_OR_RETURN(args.state_c, r.Input("c0", c_shape, c_shape, DType::kF32));
    LAIR_ASSIGN_OR_RETURN(args.state_n, r.Input("n0", n_shape, n_shape, DType::kF32));
    if (stabilized) {
      LAIR_ASSIGN_OR_RETURN(args.state_m, r.Input("m0", m_shape, m_shape, DType::kF32));
    }
    return absl::OkStatus();
  };
  for (const FormCase& form : kForms) {
    MlstmForwardArgs args = base;
    LAIR_ASSIGN_OR_RETURN(args.h, r.Output(r.act(), {N, H, V}));
    LAIR_RETURN_IF_ERROR(load_states(args));
    LAIR_RETURN_IF_ERROR(r.backend().MlstmForward(batch, args, form.form));
    LAIR_RETURN_IF_ERROR(r.backend().Synchronize());
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat(form.label, " h"), args.h, "h", r.out_tol()));
    LAIR_RETURN_IF_ERROR(
        r.Compare(absl::StrCat(form.label, " ct"), args.state_c, "ct", r.out_tol()));
    LAIR_RETURN_IF_ERROR(
        r.Compare(absl::StrCat(form.label, " nt"), args.state_n, "nt", r.out_tol()));
    if (stabilized) {
      LAIR_RETURN_IF_ERROR(
          r.Compare(absl::StrCat(form.label, " mt"), args.state_m, "mt", r.out_tol()));
    }
  }

  MlstmBackwardArgs args;
  args.fwd = base;
  LAIR_RETURN_IF_ERROR(load_states(args.fwd));
  LAIR_ASSIGN_OR_RETURN(args.fwd.h, r.Input("h", {B, T, H, V}, {N, H, V}, r.act()));
  LAIR_ASSIGN_OR_RETURN(args.d_h, r.Input("dh", {B, T, H, V}, {N, H, V}, r.act()));
  if (r.Has("dct")) {
    LAIR_ASSIGN_OR_RETURN(args.d_ct, r.Input("dct", c_shape, c_shape, DType::kF32));
  }
  if (r.Has("dnt")) {
    LAIR_ASSIGN_OR_RETURN(args.d_nt, r.Input("dnt", n_shape, n_shape, DType::kF32));
  }
  LAIR_ASSIGN_OR_RETURN(args.dq, r.Output(r.act(), {N, H, K}));
  LAIR_ASSIGN_OR_RETURN(args.dk, r.Output(r.act(), {N, H, K}));
  LAIR_ASSIGN_OR_RETURN(args.dv, r.Output(r.act(), {N, H, V}));
  LAIR_ASSIGN_OR_RETURN(args.di, r.Output(DType::kF32, {N, H}));
  LAIR_ASSIGN_OR_RETURN(args.df, r.Output(DType::kF32, {N, H}));
  std::vector<std::pair<std::string, Tensor*>> checked = {
      {"dq", &args.dq}, {"dk", &args.dk}, {"dv", &args.dv}, {"di", &args.di}, {"df", &args.df}};
  if (r.Has("dc0")) {
    LAIR_ASSIGN_OR_RETURN(args.d_c0, r.Output(DType::kF32, c_shape));
    checked.push_back({"dc0", &args.d_c0});
  }
  if (r.Has("dn0")) {
    LAIR_ASSIGN_OR_RETURN(args.d_n0, r.Output(DType::kF32, n_shape));
    checked.push_back({"dn0", &args.d_n0});
  }
  LAIR_RETURN_IF_ERROR(r.backend().MlstmBackward(batch, args));
  LAIR_RETURN_IF_ERROR(r.backend().Synchronize());
  for (const auto& [name, tensor] : checked) {
    LAIR_RETURN_IF_ERROR(r.Compare(absl::StrCat("backward ", name), *tensor, name, r.grad_tol()));
  }
  return absl::OkStatus();
}

absl::Status RunOp(OpRunner& r, const OpSpec& spec) {
  if (spec.kind == "gsa") return RunGsa(r, spec);
  if (spec.kind == "mlstm_exp") return RunMlstm(r, spec, MlstmKind::kExp);
  if (spec.kind == "mlstm_sig") return RunMlstm(r, spec, MlstmKind::kSig);
  if (spec.kind == "mlstm_sig_norm") return RunMlstm(r, spec, MlstmKind::kSigNorm);
  return RunDecay(r, spec);
}

}  // namespace

bool OpReport::passed() const {
  if (!status.ok() || checks.empty()) return false;
  for (const TensorCheck& check : checks) {
    if (!check.passed()) return false;
  }
  return true;
}

double OutputTolerance(DType dtype) { return dtype == DType::kF32 ? 1e-5 : 2e-2; }
double GradientTolerance(DType dtype) { return dtype == DType::kF32 ? 1e-4 : 5e-2; }

absl::StatusOr<std::vector<OpSpec>> ReadOpsManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  // ordered_json keeps the manifest's own order of ops.
  const nlohmann::ordered_json manifest =
      nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  std::vector<OpSpec> ops;
  for (const auto& [name, entry] : manifest.items()) {
    if (name.starts_with("_")) continue;
    if (!entry.is_object() || !entry.contains("kind") || !entry["kind"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": op ", name, " has no string \"kind\""));
    }
    OpSpec spec;
    spec.name = name;
    spec.kind = entry["kind"].get<std::string>();
    if (entry.contains("scale") && entry["scale"].is_number())
      spec.scale = entry["scale"].get<float>();
    if (entry.contains("eps") && entry["eps"].is_number()) spec.eps = entry["eps"].get<float>();
    ops.push_back(std::move(spec));
  }
  return ops;
}

OpReport VerifyOp(Backend& backend, const std::string& dir, const OpSpec& spec,
                  const VerifyOpsOptions& options) {
  OpReport report;
  report.spec = spec;
  absl::StatusOr<std::shared_ptr<const SafetensorsFile>> file =
      SafetensorsFile::Open(dir + "/" + spec.name + ".safetensors");
  if (!file.ok()) {
    report.status = file.status();
    return report;
  }
  OpRunner runner(backend, *std::move(file), options, report);
  report.status = RunOp(runner, spec);
  return report;
}

void AddRoundingFloor(Backend& exact, const std::string& dir, const VerifyOpsOptions& options,
                      OpReport& report) {
  if (options.dtype == DType::kF32) return;
  VerifyOpsOptions rounded = options;
  rounded.rounded_in_f32 = true;
  const OpReport floor = VerifyOp(exact, dir, report.spec, rounded);
  for (TensorCheck& check : report.checks) {
    for (const TensorCheck& f : floor.checks) {
      if (f.label != check.label || f.values.numel() != check.values.numel()) continue;
      check.floor = f.relative_error;
      check.own_error = RelativeError(check.values, f.values);
    }
  }
}

}  // namespace lair::kernels
