// A decoder's one-sequence decode step as a single persistent kernel, where
// a backend has one (Backend::MakePersistentDecode; the CUDA backend's is
// kernels/cuda/persistent_decode.h). The model describes its weights once;
// the backend lays them out for the kernel and runs a step per call, reading
// and writing the recurrent states in their pool slots as the op-by-op step
// does. Only decoders whose every layer is a GLA-shaped vector-decay mixer
// (low-rank gate, per-head RMSNorm gated by swish(g), no short convolution
// or feature map) and a SwiGLU MLP have this form.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace lair::kernels {

// One layer's weights, as the model holds them on the backend's device:
// matrices [out, in] in bf16 (the kernel rounds nothing the model's own
// products would not), vectors F32. A norm weight left undefined is folded
// into the products that read the norm (models/decoder.h FoldNormWeights).
struct PersistentDecodeLayer {
  Tensor mixer_norm;         // [hidden] or undefined
  Tensor q, k, v;            // [H·dk, hidden], [H·dk, hidden], [H·dv, hidden]
  Tensor g;                  // [H·dv, hidden] (the output gate) or undefined
  Tensor gate_in;            // gk_proj.0 [rank, hidden]
  Tensor gate_out;           // gk_proj.1 [H·dk, rank]
  Tensor gate_bias;          // [H·dk] or undefined
  Tensor head_norm;          // [dv] or undefined (no affine weight)
  Tensor o;                  // [hidden, H·dv]
  Tensor mlp_norm;           // [hidden] or undefined
  Tensor up_gate, up, down;  // [ffn, hidden], [ffn, hidden], [hidden, ffn]
};

struct PersistentDecodeModel {
  int heads = 0, dk = 0, dv = 0, rank = 0;
  float gate_scale = 1.0f;  // gk = gate_scale · log σ(·)
  float block_eps = 1e-6f, head_eps = 1e-6f;
  Tensor embedding;  // [vocab, hidden] F32
  std::vector<PersistentDecodeLayer> layers;
  Tensor final_norm;  // [hidden] or undefined
  Tensor lm_head;     // [vocab, hidden]
};

class PersistentDecode {
 public:
  virtual ~PersistentDecode() = default;
  // The logits [1, vocab] F32 (on the device, valid until the next Step) of
  // `token` appended to slot `slot`, whose state tensors (one [slots, H,
  // dk, dv] F32 pool tensor a layer) it updates in place; `ids` (device I32
  // [1]), when defined, receives the logits' first largest index, as
  // Backend::ArgmaxRows would.
  virtual absl::StatusOr<Tensor> Step(int32_t token, int slot, std::span<const Tensor> states,
                                      const Tensor& ids) = 0;
};

}  // namespace lair::kernels
