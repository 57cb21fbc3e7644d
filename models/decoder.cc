#include "models/decoder.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "models/families.h"

namespace lair::models {

using kernels::NormKind;
using kernels::UnaryOp;

std::string LayerPrefix(const SkeletonNames& names, int layer) {
  return absl::StrReplaceAll(names.layer, {{"{i}", absl::StrCat(layer)}});
}

absl::StatusOr<DecoderSpec> DeclareSkeleton(const DecoderConfig& config, const SkeletonNames& names,
                                            Params& params) {
  const int64_t d = config.hidden_size, ffn = config.intermediate_size;
  DecoderSpec spec;
  LAIR_ASSIGN_OR_RETURN(spec.embedding, params.Add(names.embedding, {config.vocab_size, d}));
  for (int i = 0; i < config.num_layers; ++i) {
    std::string prefix = LayerPrefix(names, i);
    LayerSpec layer;
    LAIR_ASSIGN_OR_RETURN(layer.mixer_norm,
                          params.Add(prefix + names.mixer_norm, {d}, InitSpec::Ones()));
    if (!names.mlp_norm.empty()) {
      LAIR_ASSIGN_OR_RETURN(layer.mlp_norm,
                            params.Add(prefix + names.mlp_norm, {d}, InitSpec::Ones()));
      LAIR_ASSIGN_OR_RETURN(layer.mlp_gate, params.AddMatrix(prefix + names.mlp_gate, {ffn, d}));
      LAIR_ASSIGN_OR_RETURN(layer.mlp_up, params.AddMatrix(prefix + names.mlp_up, {ffn, d}));
      LAIR_ASSIGN_OR_RETURN(layer.mlp_down, params.AddMatrix(prefix + names.mlp_down, {d, ffn}));
    }
    spec.layers.push_back(std::move(layer));
  }
  LAIR_ASSIGN_OR_RETURN(spec.final_norm, params.Add(names.final_norm, {d}, InitSpec::Ones()));
  if (config.tie_word_embeddings) {
    spec.lm_head = spec.embedding;
  } else {
    LAIR_ASSIGN_OR_RETURN(spec.lm_head, params.AddMatrix(names.lm_head, {config.vocab_size, d}));
  }
  return spec;
}

namespace {

// ForwardSample's argument checks.
absl::Status CheckSampleArgs(const ForwardBatch& batch, std::span<const kernels::RowSampling> rows,
                             std::span<const int32_t> host_rows) {
  if (batch.all_logits || !batch.logit_rows.empty())
    return absl::InvalidArgumentError("ForwardSample: all_logits and logit_rows are not supported");
  if (static_cast<int>(rows.size()) != batch.num_seqs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardSample: ", rows.size(), " sampling rules for ", batch.num_seqs(), " sequences"));
  }
  for (size_t i = 0; i < host_rows.size(); ++i) {
    if (host_rows[i] < 0 || host_rows[i] >= batch.num_seqs() ||
        (i > 0 && host_rows[i] <= host_rows[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardSample: host row ", host_rows[i],
                                                     " is out of range or out of order"));
    }
  }
  return absl::OkStatus();
}

class Decoder : public Model {
 public:
  Decoder(DecoderConfig config, std::unique_ptr<Params> params, DecoderSpec spec,
          kernels::Backend* backend, int max_context, bool step_graphs,
          std::vector<int> folded_norms)
      : config_(std::move(config)),
        params_(std::move(params)),
        spec_(std::move(spec)),
        backend_(backend),
        max_context_(max_context),
        step_graphs_(step_graphs),
        folded_norms_(std::move(folded_norms)) {
    StateLayout layout;
    for (size_t i = 0; i < spec_.layers.size(); ++i) {
      state_base_.push_back(static_cast<int>(layout.tensors.size()));
      spec_.layers[i].mixer->DeclareState(absl::StrCat("layers.", i, "."), 1, &layout);
    }
    // A state that grows with max_context is a KV cache.
    const StateLayout longer = Layout(2);
    for (size_t i = 0; i < layout.tensors.size(); ++i) {
      has_kv_cache_ |= layout.tensors[i].shape != longer.tensors[i].shape;
    }
  }

  const std::string& family() const override { return config_.model_type; }
  int vocab_size() const override { return config_.vocab_size; }
  StateLayout state_layout() const override { return Layout(max_context_); }
  ModelSize size() const override;

  absl::StatusOr<Tensor> Forward(const ForwardBatch& batch, StatePool& pool) override {
    LAIR_ASSIGN_OR_RETURN(StepOutput out, Step(batch, pool, /*greedy=*/false));
    return backend_->Download(out.logits);
  }
  absl::StatusOr<std::vector<int32_t>> ForwardGreedy(const ForwardBatch& batch,
                                                     StatePool& pool) override {
    if (batch.all_logits || !batch.logit_rows.empty())
      return absl::InvalidArgumentError(
          "ForwardGreedy: all_logits and logit_rows are not supported");
    LAIR_ASSIGN_OR_RETURN(StepOutput out, Step(batch, pool, /*greedy=*/true));
    LAIR_ASSIGN_OR_RETURN(Tensor ids, backend_->Download(out.ids));
    return std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
  }
  absl::StatusOr<SampledStep> ForwardSample(const ForwardBatch& batch, StatePool& pool,
                                            std::span<const kernels::RowSampling> rows,
                                            std::span<const int32_t> host_rows) override {
    LAIR_RETURN_IF_ERROR(CheckSampleArgs(batch, rows, host_rows));
    // The step's ids buffer (its argmax) takes the drawn tokens.
    LAIR_ASSIGN_OR_RETURN(StepOutput step, Step(batch, pool, /*greedy=*/true));
    const bool logprobs = std::any_of(
        rows.begin(), rows.end(), [](const kernels::RowSampling& r) { return r.logprobs >= 0; });
    const int64_t seqs = batch.num_seqs();
    kernels::DrawLogprobs drawn;
    if (logprobs) {
      LAIR_ASSIGN_OR_RETURN(drawn.values, backend_->AllocateScratch(
                                              DType::kF32, {seqs, 1 + kernels::kMaxRowLogprobs}));
      LAIR_ASSIGN_OR_RETURN(
          drawn.top_ids, backend_->AllocateScratch(DType::kI32, {seqs, kernels::kMaxRowLogprobs}));
    }
    LAIR_RETURN_IF_ERROR(backend_->SampleRows(step.logits, rows, step.ids, drawn));
    // The rows the host samples, gathered where the logits are (queued
    // before the tokens' download waits) and downloaded in one copy rather
    // than one synchronized copy a row.
    const auto host = static_cast<int64_t>(host_rows.size());
    const int64_t vocab = step.logits.dim(1);
    Tensor gathered;
    if (host > 0) {
      const std::span<const int32_t> parts[] = {host_rows};
      LAIR_ASSIGN_OR_RETURN(std::vector<Tensor> staged, backend_->StageInts(parts));
      LAIR_ASSIGN_OR_RETURN(gathered, backend_->AllocateScratch(DType::kF32, {host, vocab}));
      LAIR_RETURN_IF_ERROR(backend_->Embedding({step.logits, staged[0], gathered}));
    }
    LAIR_ASSIGN_OR_RETURN(Tensor ids, backend_->Download(step.ids));
    SampledStep out;
    out.tokens.assign(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
    if (logprobs) {
      LAIR_ASSIGN_OR_RETURN(out.logprobs.values, backend_->Download(drawn.values));
      LAIR_ASSIGN_OR_RETURN(out.logprobs.top_ids, backend_->Download(drawn.top_ids));
    }
    if (host == 0) {
      out.host_logits = Tensor::Zeros(DType::kF32, {0, vocab});
    } else {
      LAIR_ASSIGN_OR_RETURN(out.host_logits, backend_->Download(gathered));
    }
    return out;
  }
  // Lays the model out for the backend's persistent decode kernel, where
  // both have one; else records why not (persistent_decode_status). Never
  // fails the model: the step graphs serve without it.
  void PreparePersistentDecode();
  int64_t persistent_decode_steps() const override { return persistent_steps_; }
  absl::Status persistent_decode_status() const override { return persistent_status_; }
  int recorded_step_graphs() const override {
    int count = 0;
    for (const auto& [size, entry] : decode_graphs_) count += entry.graph != nullptr;
    return count;
  }
  absl::StatusOr<LossAndGradients> LossAndGrad(const std::vector<int32_t>& tokens) override;

 private:
  // A forward's device results, valid until the next step.
  struct StepOutput {
    Tensor logits;  // [rows, vocab] F32
    Tensor ids;     // [rows] I32 greedy tokens, when asked for (or recorded)
  };
  // A recorded decode step of one batch size.
  struct DecodeGraph {
    bool warm = false;  // a step of this size ran op by op: scratch and plans are sized
    std::unique_ptr<kernels::StepGraph> graph;
    uint64_t epoch = 0;                    // Backend::memory_epoch when recorded
    uint64_t failed_epoch = ~uint64_t{0};  // the epoch of the last failed recording
    const void* metadata = nullptr;        // the staged token ids it reads
    const void* state = nullptr;           // the pool it reads and writes
    StepOutput out;
  };

  // The forward of `batch` as one backend step; the results stay on the device.
  absl::StatusOr<StepOutput> Step(const ForwardBatch& batch, StatePool& pool, bool greedy);
  // Runs (or queues, while recording) the ops of a forward; with `greedy`
  // (or when recording) also the ids.
  absl::StatusOr<StepOutput> RunOps(const StepContext& ctx, const Tensor& tokens,
                                    const Tensor& last_rows, bool greedy);

  StateLayout Layout(int max_context) const {
    StateLayout layout;
    for (size_t i = 0; i < spec_.layers.size(); ++i) {
      spec_.layers[i].mixer->DeclareState(absl::StrCat("layers.", i, "."), max_context, &layout);
    }
    return layout;
  }

  absl::StatusOr<Tensor> UploadInts(const std::vector<int32_t>& values) {
    Tensor host = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), host.data<int32_t>());
    return backend_->Upload(host, DType::kI32);
  }

  absl::Status CheckBatch(const ForwardBatch& batch, const StatePool& pool) const;

  // The model as the backend's persistent decode kernel takes it, or
  // nullopt where a layer has no such form (or no MLP, or the head is
  // soft-capped, or layers take extras).
  std::optional<kernels::PersistentDecodeModel> PersistentModel() const;
  // A one-sequence decode step through the persistent kernel.
  absl::StatusOr<StepOutput> PersistentStep(int32_t token, int slot, const StatePool& pool,
                                            bool greedy);

  // Embedding through the head for the batch in `ctx`; with `last_rows`
  // defined only those rows of the final hidden state reach the head.
  absl::StatusOr<Var> Run(Graph& g, StepContext ctx, const Tensor& tokens,
                          const Tensor& last_rows) const;

  DecoderConfig config_;
  std::unique_ptr<Params> params_;
  DecoderSpec spec_;
  kernels::Backend* backend_;
  int max_context_;
  bool step_graphs_;
  std::unique_ptr<kernels::PersistentDecode> persistent_;
  absl::Status persistent_status_ =
      absl::UnimplementedError("persistent decode not requested (LoadOptions::persistent_decode)");
  int64_t persistent_steps_ = 0;
  bool has_kv_cache_ = false;  // a state sized by max_context (graph replays skip its bound check)
  std::vector<int> folded_norms_;             // FoldNormWeights' result, or empty
  std::vector<int> state_base_;               // per layer: index of its first state tensor
  std::map<int, DecodeGraph> decode_graphs_;  // by batch size
};

ModelSize Decoder::size() const {
  ModelSize size;
  for (int id = 0; id < params_->size(); ++id) {
    const Tensor& t = params_->tensors()[id];
    size.weight_bytes += static_cast<int64_t>(t.nbytes());
    // A derived weight stands in for products of the model's own, so it is
    // not among the parameters or the floor's bytes.
    if (params_->is_derived(id)) continue;
    size.parameters += t.numel();
    if (id != spec_.embedding || spec_.lm_head == spec_.embedding) {
      size.forward_weight_bytes += static_cast<int64_t>(t.nbytes());
    }
    if (params_->is_matrix(id) && id != spec_.lm_head) size.matrix_parameters += t.numel();
  }
  size.head_parameters = params_->tensors()[spec_.lm_head].numel();
  return size;
}

absl::Status Decoder::CheckBatch(const ForwardBatch& batch, const StatePool& pool) const {
  const int n = static_cast<int>(batch.tokens.size()), seqs = batch.num_seqs();
  if (seqs < 1) return absl::InvalidArgumentError("ForwardBatch: no sequences");
  if (static_cast<int>(batch.cu_seqlens.size()) != seqs + 1 ||
      static_cast<int>(batch.start_positions.size()) != seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardBatch: ", seqs, " slots need ", seqs + 1, " cu_seqlens and ", seqs,
        " start_positions, got ", batch.cu_seqlens.size(), " and ", batch.start_positions.size()));
  }
  if (batch.cu_seqlens[0] != 0 || batch.cu_seqlens[seqs] != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBatch: cu_seqlens must run from 0 to ", n));
  }
  std::set<int32_t> slots;
  for (int s = 0; s < seqs; ++s) {
    if (batch.cu_seqlens[s + 1] <= batch.cu_seqlens[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: sequence ", s, " has no tokens"));
    }
    if (batch.slots[s] < 0 || batch.slots[s] >= pool.num_slots() ||
        !slots.insert(batch.slots[s]).second) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: slot ", batch.slots[s],
                                                     " of sequence ", s,
                                                     " is out of range or used twice"));
    }
    if (batch.start_positions[s] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: negative start position for sequence ", s));
    }
  }
  if (batch.all_logits && !batch.logit_rows.empty()) {
    return absl::InvalidArgumentError("ForwardBatch: all_logits and logit_rows both set");
  }
  for (int32_t row : batch.logit_rows) {
    if (row < 0 || row >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: logit row ", row, " outside the ", n, " tokens"));
    }
  }
  for (int i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: token ", batch.tokens[i],
                                                     " at ", i, " outside the vocabulary of ",
                                                     config_.vocab_size));
    }
  }
  const StateLayout expected = state_layout();
  bool same = pool.layout().tensors.size() == expected.tensors.size();
  for (size_t i = 0; same && i < expected.tensors.size(); ++i) {
    same = pool.layout().tensors[i].name == expected.tensors[i].name &&
           pool.layout().tensors[i].shape == expected.tensors[i].shape;
  }
  if (!same)
    return absl::InvalidArgumentError("ForwardBatch: the state pool was made for another model");
  return absl::OkStatus();
}

absl::StatusOr<Var> Decoder::Run(Graph& g, StepContext ctx, const Tensor& tokens,
                                 const Tensor& last_rows) const {
  const float eps = static_cast<float>(config_.norm_eps);
  std::vector<Var> extras;
  if (spec_.layer_extras) {
    LAIR_ASSIGN_OR_RETURN(extras, spec_.layer_extras(g));
  }
  LAIR_ASSIGN_OR_RETURN(Var x, g.Embedding(spec_.embedding, tokens));
  // x is the residual stream. Each block's first products form its input
  // norm and its last product adds its output back to x.
  for (size_t i = 0; i < spec_.layers.size(); ++i) {
    const LayerSpec& layer = spec_.layers[i];
    ctx.state_base = state_base_[i];
    ctx.layer_extra = extras.empty() ? Var{} : extras[i];
    LAIR_ASSIGN_OR_RETURN(
        x, layer.mixer->Forward(g, LinearInput::Normed(x, layer.mixer_norm, NormKind::kRms, eps),
                                ctx));
    if (layer.mlp_norm >= 0) {
      LAIR_ASSIGN_OR_RETURN(x, g.SwiGlu(LinearInput::Normed(x, layer.mlp_norm, NormKind::kRms, eps),
                                        layer.mlp_gate, layer.mlp_up, layer.mlp_down, x));
    }
  }
  if (last_rows.defined()) {
    LAIR_ASSIGN_OR_RETURN(x, g.GatherRows(x, last_rows));
  }
  LAIR_ASSIGN_OR_RETURN(
      Var logits,
      g.Linear(LinearInput::Normed(x, spec_.final_norm, NormKind::kRms, eps), {spec_.lm_head}));
  if (spec_.logit_soft_cap > 0) {
    LAIR_ASSIGN_OR_RETURN(logits, g.Unary(UnaryOp::kTanh, logits, spec_.logit_soft_cap, 0.0f,
                                          1.0f / spec_.logit_soft_cap));
  }
  return logits;
}

absl::StatusOr<Decoder::StepOutput> Decoder::RunOps(const StepContext& ctx, const Tensor& tokens,
                                                    const Tensor& last_rows, bool greedy) {
  Graph g(backend_, &params_->tensors(), /*record=*/false,
          folded_norms_.empty() ? nullptr : &folded_norms_);
  LAIR_ASSIGN_OR_RETURN(Var logits, Run(g, ctx, tokens, last_rows));
  StepOutput out{logits.t, Tensor()};
  if (greedy) {
    LAIR_ASSIGN_OR_RETURN(out.ids, backend_->AllocateScratch(DType::kI32, {logits.dim(0)}));
    LAIR_RETURN_IF_ERROR(backend_->ArgmaxRows(logits.t, out.ids));
  }
  return out;
}

std::optional<kernels::PersistentDecodeModel> Decoder::PersistentModel() const {
  if (spec_.logit_soft_cap > 0 || spec_.layer_extras || spec_.layers.empty()) return std::nullopt;
  const std::vector<Tensor>& t = params_->tensors();
  const auto tensor = [&](int id) { return id >= 0 ? t[id] : Tensor(); };
  // A norm's weight, undefined where FoldNormWeights folded it into `into`.
  const auto norm = [&](int id, int into) {
    return !folded_norms_.empty() && folded_norms_[into] == id ? Tensor() : tensor(id);
  };
  kernels::PersistentDecodeModel m;
  m.block_eps = static_cast<float>(config_.norm_eps);
  m.embedding = tensor(spec_.embedding);
  for (const LayerSpec& layer : spec_.layers) {
    const std::optional<VectorDecayDecodeForm> f = layer.mixer->PersistentDecodeForm();
    if (!f || layer.mlp_norm < 0) return std::nullopt;
    if (m.layers.empty()) {
      m.heads = f->heads, m.dk = f->dk, m.dv = f->dv, m.rank = f->rank;
      m.gate_scale = f->gate_scale, m.head_eps = f->head_eps;
    } else if (f->heads != m.heads || f->dk != m.dk || f->dv != m.dv || f->rank != m.rank ||
               f->gate_scale != m.gate_scale || f->head_eps != m.head_eps) {
      return std::nullopt;
    }
    kernels::PersistentDecodeLayer l;
    l.mixer_norm = norm(layer.mixer_norm, f->q);
    l.q = tensor(f->q), l.k = tensor(f->k), l.v = tensor(f->v), l.g = tensor(f->g);
    l.gate_in = tensor(f->gate_in), l.gate_out = tensor(f->gate_out);
    l.gate_bias = tensor(f->gate_bias), l.head_norm = tensor(f->head_norm), l.o = tensor(f->o);
    l.mlp_norm = norm(layer.mlp_norm, layer.mlp_gate);
    l.up_gate = tensor(layer.mlp_gate), l.up = tensor(layer.mlp_up),
    l.down = tensor(layer.mlp_down);
    m.layers.push_back(std::move(l));
  }
  m.final_norm = norm(spec_.final_norm, spec_.lm_head);
  m.lm_head = tensor(spec_.lm_head);
  return m;
}

void Decoder::PreparePersistentDecode() {
  const std::optional<kernels::PersistentDecodeModel> m = PersistentModel();
  if (!m) {
    persistent_status_ = absl::UnimplementedError(
        "persistent decode: a layer is not GLA-shaped with an MLP, or the head is soft-capped");
    return;
  }
  absl::StatusOr<std::unique_ptr<kernels::PersistentDecode>> made =
      backend_->MakePersistentDecode(*m);
  if (!made.ok()) {
    persistent_status_ = made.status();
    return;
  }
  persistent_ = std::move(*made);
  persistent_status_ = absl::OkStatus();
}

absl::StatusOr<Decoder::StepOutput> Decoder::PersistentStep(int32_t token, int slot,
                                                            const StatePool& pool, bool greedy) {
  std::vector<Tensor> states;
  for (int base : state_base_) states.push_back(pool.tensor(base));
  StepOutput out;
  if (greedy) {
    LAIR_ASSIGN_OR_RETURN(out.ids, backend_->AllocateScratch(DType::kI32, {1}));
  }
  LAIR_ASSIGN_OR_RETURN(out.logits, persistent_->Step(token, slot, states, out.ids));
  ++persistent_steps_;
  return out;
}

absl::StatusOr<Decoder::StepOutput> Decoder::Step(const ForwardBatch& batch, StatePool& pool,
                                                  bool greedy) {
  LAIR_RETURN_IF_ERROR(CheckBatch(batch, pool));
  const int seqs = batch.num_seqs();
  std::vector<int32_t> positions, last;
  int max_seqlen = 0;
  for (int s = 0; s < seqs; ++s) {
    int len = batch.cu_seqlens[s + 1] - batch.cu_seqlens[s];
    max_seqlen = std::max(max_seqlen, len);
    for (int j = 0; j < len; ++j) positions.push_back(batch.start_positions[s] + j);
    last.push_back(batch.cu_seqlens[s + 1] - 1);
  }
  if (!batch.logit_rows.empty()) last = batch.logit_rows;
  backend_->BeginStep();
  struct EndStep {
    kernels::Backend* backend;
    ~EndStep() { backend->EndStep(); }
  } end_step{backend_};
  // A decode step of one sequence is the persistent kernel, which takes its
  // token by value: nothing to stage.
  bool decode = !batch.all_logits && batch.logit_rows.empty() && max_seqlen == 1;
  for (int s = 0; has_kv_cache_ && s < seqs; ++s) decode &= batch.start_positions[s] < max_context_;
  if (decode && seqs == 1 && persistent_)
    return PersistentStep(batch.tokens[0], batch.slots[0], pool, greedy);
  // Every small input in one copy: tokens, offsets, slots, positions, last rows, starts.
  const std::span<const int32_t> parts[] = {
      batch.tokens, batch.cu_seqlens, batch.slots, positions, last, batch.start_positions};
  LAIR_ASSIGN_OR_RETURN(std::vector<Tensor> staged, backend_->StageInts(parts));
  const bool on_device = backend_->device() != Device::kCpu;
  StepContext ctx;
  ctx.batch.num_seqs = seqs;
  ctx.batch.cu_seqlens = batch.cu_seqlens;
  ctx.batch.state_slot = batch.slots;
  ctx.batch.max_seqlen = max_seqlen;
  if (on_device) {
    ctx.batch.cu_seqlens_device = staged[1].data<int32_t>();
    ctx.batch.state_slot_device = staged[2].data<int32_t>();
    ctx.start_positions_device = staged[5].data<int32_t>();
  }
  ctx.pool = &pool;
  ctx.start_positions = batch.start_positions;
  ctx.positions = staged[3];
  const Tensor& tokens = staged[0];
  const Tensor last_rows = batch.all_logits ? Tensor() : staged[4];

  // A decode step replays its graph, records one, or runs op by op.
  if (!decode || !step_graphs_) return RunOps(ctx, tokens, last_rows, greedy);
  DecodeGraph& entry = decode_graphs_[seqs];
  const uint64_t epoch = backend_->memory_epoch();
  const void* state = pool.layout().tensors.empty() ? nullptr : pool.tensor(0).raw();
  if (entry.graph &&
      (entry.epoch != epoch || entry.metadata != tokens.raw() || entry.state != state)) {
    entry.graph.reset();
  }
  if (!entry.graph && entry.warm && entry.failed_epoch != epoch) {
    StepOutput recorded;
    absl::StatusOr<std::unique_ptr<kernels::StepGraph>> graph =
        backend_->CaptureStep([&]() -> absl::Status {
          LAIR_ASSIGN_OR_RETURN(recorded, RunOps(ctx, tokens, last_rows, /*greedy=*/true));
          return absl::OkStatus();
        });
    if (graph.ok()) {
      entry.graph = std::move(*graph);
      entry.epoch = epoch;
      entry.metadata = tokens.raw();
      entry.state = state;
      entry.out = recorded;
    } else {
      entry.failed_epoch = epoch;  // retried once memory has moved (e.g. the arena grew)
    }
  }
  if (!entry.graph) {
    entry.warm = true;
    return RunOps(ctx, tokens, last_rows, greedy);
  }
  LAIR_RETURN_IF_ERROR(entry.graph->Launch());
  return entry.out;
}

absl::StatusOr<LossAndGradients> Decoder::LossAndGrad(const std::vector<int32_t>& tokens) {
  if (tokens.size() < 2) return absl::InvalidArgumentError("LossAndGrad: needs at least 2 tokens");
  if (!folded_norms_.empty()) {
    return absl::FailedPreconditionError(
        "LossAndGrad: the model was loaded with its norm weights folded into its products "
        "(LoadOptions::fold_norm_weights), so its weights are not the checkpoint's parameters; "
        "load it without folding to train");
  }
  for (int id = 0; id < params_->size(); ++id) {
    if (params_->is_derived(id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "LossAndGrad: the model was loaded with ", params_->name(id),
          " derived for inference (LoadOptions::fuse_low_rank_gates); load it without to train"));
    }
  }
  // Logits at positions 0..T-2 depend only on tokens 0..T-2 (causality).
  const int n = static_cast<int>(tokens.size()) - 1;
  std::vector<int32_t> inputs(tokens.begin(), tokens.end() - 1),
      targets(tokens.begin() + 1, tokens.end());
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("LossAndGrad: token ", t, " outside the vocabulary"));
    }
  }
  LAIR_ASSIGN_OR_RETURN(StatePool pool, StatePool::Create(backend_, Layout(n), 1));
  std::vector<int32_t> cu_seqlens = {0, n}, slots = {0}, starts = {0}, positions(n);
  for (int i = 0; i < n; ++i) positions[i] = i;
  StepContext ctx;
  ctx.batch.num_seqs = 1;
  ctx.batch.cu_seqlens = cu_seqlens;
  ctx.batch.state_slot = slots;
  ctx.batch.zero_initial_state = true;
  ctx.batch.max_seqlen = n;
  Tensor cu_device, slot_device;
  if (backend_->device() != Device::kCpu) {
    LAIR_ASSIGN_OR_RETURN(cu_device, UploadInts(cu_seqlens));
    LAIR_ASSIGN_OR_RETURN(slot_device, UploadInts(slots));
    ctx.batch.cu_seqlens_device = cu_device.data<int32_t>();
    ctx.batch.state_slot_device = slot_device.data<int32_t>();
  }
  ctx.pool = &pool;
  ctx.start_positions = starts;
  ctx.form = kernels::MixerForm::kChunked;
  LAIR_ASSIGN_OR_RETURN(ctx.positions, UploadInts(positions));
  LAIR_ASSIGN_OR_RETURN(Tensor input_ids, UploadInts(inputs));
  LAIR_ASSIGN_OR_RETURN(Tensor target_ids, UploadInts(targets));
  Graph g(backend_, &params_->tensors(), /*record=*/true);
  LAIR_ASSIGN_OR_RETURN(Var logits, Run(g, ctx, input_ids, Tensor()));
  LAIR_ASSIGN_OR_RETURN(double loss_sum, g.CrossEntropy(logits, target_ids, 1.0f / n));
  LAIR_RETURN_IF_ERROR(g.Backward());
  LossAndGradients result;
  result.loss = loss_sum / n;
  for (int id = 0; id < params_->size(); ++id) {
    const Tensor& param = params_->tensors()[id];
    Tensor grad = g.ParamGrad(id);
    Tensor host;
    if (grad.defined()) {
      LAIR_ASSIGN_OR_RETURN(host, backend_->Download(grad));
      host = host.Reshape(param.shape());
    } else {
      host = Tensor::Zeros(DType::kF32, param.shape());
    }
    result.gradients.emplace_back(params_->name(id), std::move(host));
  }
  return result;
}

}  // namespace

std::unique_ptr<Model> MakeDecoder(const DecoderConfig& config, std::unique_ptr<Params> params,
                                   DecoderSpec spec, kernels::Backend* backend, int max_context,
                                   bool step_graphs, std::vector<int> folded_norms,
                                   bool persistent_decode) {
  auto decoder = std::make_unique<Decoder>(config, std::move(params), std::move(spec), backend,
                                           max_context, step_graphs, std::move(folded_norms));
  if (persistent_decode) decoder->PreparePersistentDecode();
  return decoder;
}

absl::Status FuseLowRankGates(DecoderSpec& spec, Params& params, std::vector<int>& folded_norms) {
  for (LayerSpec& layer : spec.layers) {
    LAIR_ASSIGN_OR_RETURN(const DerivedWeight fused, layer.mixer->FuseLowRankGate(params));
    if (fused.id < 0 || folded_norms.empty()) continue;
    folded_norms.resize(params.size(), -1);
    folded_norms[fused.id] = folded_norms[fused.reads_as];
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> FoldNormWeights(const DecoderSpec& spec, Params& params) {
  std::vector<int> folded(params.size(), -1);
  const auto fold = [&](int norm, std::span<const int> weights) -> absl::Status {
    for (int w : weights) {
      if (folded[w] >= 0) {
        return absl::InternalError(absl::StrCat(params.name(w),
                                                " reads two norms: ", params.name(folded[w]),
                                                " and ", params.name(norm)));
      }
      LAIR_RETURN_IF_ERROR(params.ScaleColumns(w, norm));
      folded[w] = norm;
    }
    return absl::OkStatus();
  };
  for (const LayerSpec& layer : spec.layers) {
    LAIR_RETURN_IF_ERROR(fold(layer.mixer_norm, layer.mixer->InputProjections()));
    if (layer.mlp_norm >= 0) {
      const int gate_up[] = {layer.mlp_gate, layer.mlp_up};
      LAIR_RETURN_IF_ERROR(fold(layer.mlp_norm, gate_up));
    }
  }
  // A tied head is the embedding table, which the lookup reads unscaled.
  if (spec.lm_head != spec.embedding) {
    const int head[] = {spec.lm_head};
    LAIR_RETURN_IF_ERROR(fold(spec.final_norm, head));
  }
  return folded;
}

}  // namespace lair::models
