// Model: a causal language model of any supported family, written once over
// kernels::Backend. A family contributes its mixer and its checkpoint names;
// embedding, norms, MLP, residuals and the LM head are shared.
//
// Per-sequence recurrent state (every layer's mixer state, short-convolution
// state and, for Llama, its KV cache) lives in a StatePool of fixed-size
// slots on the backend's device, so prefill can stop after any token and
// decoding resume from the slot.
//
// Thread safety: a Model is immutable after Load; Forward calls on one
// backend must come from one thread at a time (the backend is not shared).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "models/state_pool.h"

namespace lair::models {

struct LoadOptions {
  DType weight_dtype = DType::kF32;  // kBF16 on CUDA for serving (emulated in F32 on the CPU)
  int max_context = 4096;            // KV-cache length per slot (softmax-attention families)
  // Record each decode batch size's step (one new token per sequence, last
  // logits) as a backend step graph (CUDA graphs) and replay it; see
  // models/decoder.h. Off: every step runs op by op.
  bool step_graphs = true;
  // Fold the norms' weights into the products that read them (models/
  // decoder.h FoldNormWeights): inference only, as the checkpoint's weights
  // are then no longer the model's parameters (LossAndGrad refuses).
  bool fold_norm_weights = false;
  // Derive each low-rank gate's two products as one weight, which decode
  // steps read among the mixer's input products where the backend does not
  // form the gate itself (models/decoder.h FuseLowRankGates): inference
  // only (LossAndGrad refuses).
  bool fuse_low_rank_gates = false;
  // Run a decode step of one sequence as the backend's persistent decode
  // kernel where it has one for the model (models/decoder.h): a copy of the
  // weights laid out at load, so serving loads ask for it (serve, generate,
  // bench decode), others not.
  bool persistent_decode = false;
};

// One engine step's worth of tokens: several sequences, each a contiguous run
// of new tokens appended to what its slot already holds.
struct ForwardBatch {
  std::vector<int32_t> tokens;           // [N] packed token ids
  std::vector<int32_t> cu_seqlens;       // [num_seqs + 1] offsets into tokens
  std::vector<int32_t> slots;            // [num_seqs] state slot of each sequence
  std::vector<int32_t> start_positions;  // [num_seqs] tokens already in each slot
  bool all_logits = false;               // logits for every token, else the last of each sequence
  // When not empty (and not all_logits): the logits of exactly these tokens,
  // indices into `tokens` in this order (a prompt being scored, say).
  std::vector<int32_t> logit_rows;
  int num_seqs() const { return static_cast<int>(slots.size()); }
};

// A loaded model's weights as a benchmark counts them.
struct ModelSize {
  int64_t parameters = 0;    // elements of every parameter tensor (a tied head counts once)
  int64_t weight_bytes = 0;  // their bytes on the device (matrices at LoadOptions::weight_dtype)
  // Of weight_bytes, what every forward reads whole: all but an untied
  // embedding table, of which a lookup reads only the batch's rows.
  int64_t forward_weight_bytes = 0;
  // Elements of the projection matrices every token goes through (MLPs and
  // mixer projections): 2 FLOPs each per token. The head is not among them.
  int64_t matrix_parameters = 0;
  // Elements of the LM head, applied only to the rows whose logits are returned.
  int64_t head_parameters = 0;
};

// Gradients of the mean next-token cross-entropy over a token sequence.
struct LossAndGradients {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> gradients;  // checkpoint name -> host F32 gradient
};

// Model::ForwardSample's result.
struct SampledStep {
  std::vector<int32_t> tokens;  // [num_seqs]
  Tensor host_logits;           // [host_rows, vocab] F32 on the host
  // When a rule asked for logprobs: the draws' logprobs on the host, in
  // kernels::DrawLogprobs' layout ([num_seqs, ...]; rows that did not ask
  // are unspecified); else undefined.
  kernels::DrawLogprobs logprobs;
};

class Model {
 public:
  virtual ~Model() = default;

  // Reads DIR/config.json and the weights. Errors name the file, tensor or
  // config field (an unknown model_type or an option we do not support is
  // refused here, not at the first forward). `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     kernels::Backend* backend,
                                                     const LoadOptions& options = {});

  virtual const std::string& family() const = 0;  // config.json model_type
  virtual int vocab_size() const = 0;
  // The shape of one sequence's state, for sizing a pool.
  virtual StateLayout state_layout() const = 0;
  virtual ModelSize size() const = 0;

  // Runs the batch, reading and updating each sequence's slot. Returns host
  // F32 logits [num_seqs, vocab] (or [N, vocab] with all_logits, or one row
  // per logit_rows entry).
  virtual absl::StatusOr<Tensor> Forward(const ForwardBatch& batch, StatePool& pool) = 0;

  // Forward, then each sequence's greedy token (the first argmax of its
  // logits row), taken where the logits are so that only num_seqs ids reach
  // the host. The default argmaxes Forward's host logits. REQUIRES:
  // !batch.all_logits and no logit_rows.
  virtual absl::StatusOr<std::vector<int32_t>> ForwardGreedy(const ForwardBatch& batch,
                                                             StatePool& pool);
  // Forward, then each sequence's token drawn from its logits row under
  // rows[s] (kernels/sampling.h), taken where the logits are, with the
  // draw's logprobs where the rule asks, and the logits rows of the
  // sequences in host_rows (ascending), which the caller draws itself
  // (their tokens are unspecified). REQUIRES: as ForwardGreedy, and one
  // rule per sequence.
  virtual absl::StatusOr<SampledStep> ForwardSample(const ForwardBatch& batch, StatePool& pool,
                                                    std::span<const kernels::RowSampling> rows,
                                                    std::span<const int32_t> host_rows) = 0;
  // How many decode batch sizes currently replay a recorded step graph
  // (LoadOptions::step_graphs); 0 where the backend records none.
  virtual int recorded_step_graphs() const { return 0; }
  // Decode steps run so far by the backend's persistent decode kernel
  // (LoadOptions::persistent_decode), and whether it serves them: OK when it
  // does, else why not (Unimplemented: not asked for, or the backend or the
  // model has no such form; another code: its layout failed, as out of
  // memory).
  virtual int64_t persistent_decode_steps() const { return 0; }
  virtual absl::Status persistent_decode_status() const {
    return absl::UnimplementedError("this model has no persistent decode step");
  }

  // Loss and every parameter's gradient for `tokens` (positions 0..T-2
  // predict tokens 1..T-1), from a zero state.
  virtual absl::StatusOr<LossAndGradients> LossAndGrad(const std::vector<int32_t>& tokens) = 0;
};

}  // namespace lair::models
