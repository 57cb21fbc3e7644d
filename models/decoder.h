// The one decoder skeleton every family shares:
//
//   x = embedding[tokens]
//   for each layer:  x = x + mixer(norm(x));  x = x + down(silu(gate(norm(x))) · up(norm(x)))
//   logits = cap(head(norm(x)))
//
// (the MLP half is absent for families without one, such as Mamba2; cap is
// c·tanh(·/c) when the family soft-caps its logits). A family contributes a
// Mixer per layer, the checkpoint names of the skeleton's weights and,
// optionally, per-layer inputs computed once per forward from model-level
// parameters (HGRN2's lower bounds); see models/families.h.
//
// Thread safety: as models/model.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/graph.h"
#include "models/model.h"
#include "models/params.h"
#include "models/state_pool.h"

namespace lair::models {

// What a mixer sees of the current step.
struct StepContext {
  kernels::SequenceBatch batch;  // packed sequences and their slots
  const StatePool* pool = nullptr;
  int state_base = 0;                        // index of this layer's first pool tensor
  Tensor positions;                          // [N] I32 device: absolute position of each token
  std::span<const int32_t> start_positions;  // [num_seqs] host: tokens already in each slot
  const int32_t* start_positions_device = nullptr;  // the same on the device (null on the CPU)
  kernels::MixerForm form = kernels::MixerForm::kAuto;
  Var layer_extra;  // this layer's output of DecoderSpec::layer_extras

  // The layer's i-th declared state tensor (the whole pool, [num_slots, ...]).
  const Tensor& State(int i) const { return pool->tensor(state_base + i); }
};

// A GLA-shaped mixer for kernels::PersistentDecodeModel: parameter ids
// (-1: none) and its shape.
struct VectorDecayDecodeForm {
  int q = -1, k = -1, v = -1, g = -1;               // g: the output gate's g_proj
  int gate_in = -1, gate_out = -1, gate_bias = -1;  // gk_proj.0, gk_proj.1 and its bias
  int head_norm = -1, o = -1;
  int heads = 0, dk = 0, dv = 0, rank = 0;
  float gate_scale = 1.0f;
  float head_eps = 1e-6f;
};

// A weight a mixer derived for inference (Mixer::FuseLowRankGate), and the
// weight whose input it reads (under the same norm, folded or not).
struct DerivedWeight {
  int id = -1;  // -1: none
  int reads_as = -1;
};

// A layer's token mixer: the only per-family computation.
class Mixer {
 public:
  virtual ~Mixer() = default;
  // Appends this layer's per-slot state tensors, named "<prefix>..." (a KV
  // cache holds `max_context` tokens), in the order State(i) reads them.
  virtual void DeclareState(const std::string& prefix, int max_context,
                            StateLayout* layout) const = 0;
  // in: the residual stream in.x [N, hidden] under the block's input norm,
  // which the mixer's first products form (Graph::Linears); returns in.x
  // plus the mixer's output, added by its last product.
  virtual absl::StatusOr<Var> Forward(Graph& g, const LinearInput& in,
                                      const StepContext& ctx) const = 0;
  // The weights of the products that read Forward's `in` under its norm,
  // and are read nowhere else: FoldNormWeights may fold the norm's weight
  // into their columns. Empty: the layer keeps its norm's weight.
  virtual std::vector<int> InputProjections() const { return {}; }
  // The mixer's parameters as a backend's persistent decode kernel takes
  // them (kernels/persistent_decode.h), where it is GLA-shaped; else nullopt.
  virtual std::optional<VectorDecayDecodeForm> PersistentDecodeForm() const { return std::nullopt; }
  // Derives a low-rank gate's two products as one weight
  // (Params::AddProduct), which the mixer's decode steps read among its
  // input products where the backend would otherwise run the gate's small
  // second product as a launch of its own (GLA: gk_proj.1 · gk_proj.0).
  // Default: none.
  virtual absl::StatusOr<DerivedWeight> FuseLowRankGate(Params& /*params*/) {
    return DerivedWeight{};
  }
};

// Checkpoint names of the skeleton's weights ("{i}" is the layer index).
struct SkeletonNames {
  std::string embedding;                   // "model.embeddings.weight"
  std::string layer;                       // "model.layers.{i}."
  std::string mixer_norm;                  // "attn_norm.weight", under `layer`
  std::string mlp_norm;                    // "mlp_norm.weight"; empty: no MLP
  std::string mlp_gate, mlp_up, mlp_down;  // under `layer`
  std::string final_norm;                  // "model.norm.weight"
  std::string lm_head = "lm_head.weight";
};

struct LayerSpec {
  int mixer_norm = -1;
  std::unique_ptr<Mixer> mixer;
  int mlp_norm = -1, mlp_gate = -1, mlp_up = -1, mlp_down = -1;  // -1: no MLP
};

struct DecoderSpec {
  int embedding = -1;
  std::vector<LayerSpec> layers;
  int final_norm = -1;
  int lm_head = -1;             // == embedding when tied
  float logit_soft_cap = 0.0f;  // 0: none
  // Optional: one value per layer, computed at the start of every forward.
  std::function<absl::StatusOr<std::vector<Var>>(Graph&)> layer_extras;
};

// "model.layers.{i}." with the index filled in.
std::string LayerPrefix(const SkeletonNames& names, int layer);

// Declares the embedding, every layer's norms and MLP, the final norm and the
// head (tied to the embedding when config.tie_word_embeddings). The family
// then sets each layer's mixer.
absl::StatusOr<DecoderSpec> DeclareSkeleton(const DecoderConfig& config, const SkeletonNames& names,
                                            Params& params);

// A Model over a finished spec. `params` holds the weights on `backend`.
//
// Every forward is one backend step (Backend::BeginStep: its temporaries
// come from the step arena) whose int metadata (tokens, offsets, slots,
// positions, last rows) reaches the device in one Backend::StageInts copy;
// the only wait is the download of the logits or greedy ids.
//
// With `step_graphs`, a decode step (every sequence one new token, last
// logits) is recorded per batch size B as a Backend::StepGraph and replayed:
// the first step of size B runs op by op (it sizes the arena and scratch and
// plans the GEMMs), the second records and launches, later ones only stage
// their metadata and launch. A graph is retaken when the backend's
// memory_epoch moves. Recording each B as it first recurs (not vLLM's padded
// buckets, captured up front) records only the sizes an engine actually
// runs and never pays for padding rows; the price is one op-by-op step and
// one recording per distinct B, and memory per graph is only its nodes
// (activations live in the shared arena).
//
// With `persistent_decode`, a decode step of one sequence runs as the
// backend's persistent decode kernel instead (Backend::MakePersistentDecode,
// built here, before any state pool takes the device's memory), where every
// layer's mixer has a PersistentDecodeForm and an MLP and the backend has
// the kernel; otherwise (Model::persistent_decode_status says why) as
// above. The kernel holds its own copy of the weights.
//
// `folded_norms` (FoldNormWeights; empty: none) says which weights carry a
// norm's weight; such a model runs inference only (LossAndGrad refuses).
std::unique_ptr<Model> MakeDecoder(const DecoderConfig& config, std::unique_ptr<Params> params,
                                   DecoderSpec spec, kernels::Backend* backend, int max_context,
                                   bool step_graphs, std::vector<int> folded_norms = {},
                                   bool persistent_decode = false);

// Folds the weight of each block's input norm into the products that read
// it (a layer's MLP gate and up, its mixer's InputProjections) and the
// final norm's into an untied head (Params::ScaleColumns), so that the norms
// are a scale of each row, which the decode GEMV forms as it multiplies
// (no pass of their own at batch 1). Returns, per parameter, the
// norm weight folded into it or -1.
absl::StatusOr<std::vector<int>> FoldNormWeights(const DecoderSpec& spec, Params& params);

// Every layer's Mixer::FuseLowRankGate, after FoldNormWeights (the fused
// weight carries the norm weight its source carries: `folded_norms`, when not
// empty, grows to mark it). Inference only: the derived weights are not the
// checkpoint's parameters, so such a model refuses LossAndGrad.
absl::Status FuseLowRankGates(DecoderSpec& spec, Params& params, std::vector<int>& folded_norms);

// The family's spec for any parsed config, weights declared through `params`
// (models/families.h has one builder per family).
absl::StatusOr<DecoderSpec> BuildDecoderSpec(const ModelConfig& config, Params& params);

}  // namespace lair::models
