#include "kernels/cuda/persistent_decode_program.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "core/status.h"
#include "kernels/cuda/persistent_decode.h"

namespace lair::kernels::cuda {
namespace {

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("persistent decode: ", std::string(what), ": ", cudaGetErrorString(err)));
}

absl::Status ExpectMatrix(const Tensor& t, int64_t rows, int64_t cols, std::string_view what) {
  if (!t.defined() || t.dtype() != DType::kBF16 || t.shape() != Shape{rows, cols})
    return absl::UnimplementedError(absl::StrCat("persistent decode: ", std::string(what),
                                                 " is not bf16 [", rows, ", ", cols, "]"));
  return absl::OkStatus();
}
absl::Status ExpectVector(const Tensor& t, int64_t n, std::string_view what) {
  if (t.defined() && (t.dtype() != DType::kF32 || t.numel() != n))
    return absl::UnimplementedError(
        absl::StrCat("persistent decode: ", std::string(what), " is not F32 [", n, "]"));
  return absl::OkStatus();
}

// A product's rows on the host: row r of the phase's stacked matrices.
struct HostRows {
  std::vector<std::pair<const uint16_t*, int64_t>> parts;  // (data, rows), stacked in order
  int64_t cols = 0;
  const uint16_t* Row(int64_t r) const {
    for (const auto& [data, rows] : parts) {
      if (r < rows) return data + r * cols;
      r -= rows;
    }
    return nullptr;
  }
};

// The tiles of `phase` for CTA c, at `out`: a row product's groups, column
// block by column block; a column product's slices, 256-row block by block.
void WriteTiles(const PersistentDecodeDims& d, DecodePhase phase, const HostRows& rows, int ctas,
                int c, uint16_t* out) {
  const DecodeShare share = PhaseShare(d, phase, ctas, c);
  const int per_unit = d.TilesPerUnit(phase);
  uint16_t* tile = out;
  if (IsColumnPhase(phase)) {
    for (int slice = share.begin; slice < share.begin + share.count; ++slice) {
      for (int b = 0; b < per_unit; ++b) {
        for (int r = 0; r < kDecodeTileCols; ++r) {
          const uint16_t* src = rows.Row(static_cast<int64_t>(b) * kDecodeTileCols + r) +
                                static_cast<int64_t>(slice) * kDecodeSliceCols;
          for (int k = 0; k < kDecodeSliceCols; ++k)
            tile[PersistentDecodeColumnTileOffset(r, k) / 2] = src[k];
        }
        tile += kDecodeTileBytes / 2;
      }
    }
    return;
  }
  for (int b = 0; b < per_unit; ++b) {
    for (int gi = share.begin; gi < share.begin + share.count; ++gi) {
      for (int r = 0; r < kDecodeTileRows; ++r) {
        // The MLP's input product pairs gate row i (tile rows 0-7) with up row i (8-15).
        const int64_t row = phase == DecodePhase::kMlpIn
                                ? (r < 8 ? 8 * gi + r : d.ffn + 8 * gi + r - 8)
                                : static_cast<int64_t>(kDecodeTileRows) * gi + r;
        const uint16_t* src = rows.Row(row) + static_cast<int64_t>(b) * kDecodeTileCols;
        for (int k = 0; k < kDecodeTileCols; ++k)
          tile[PersistentDecodeTileOffset(r, k) / 2] = src[k];
      }
      tile += kDecodeTileBytes / 2;
    }
  }
}

int64_t PhaseBytes(const PersistentDecodeDims& d, DecodePhase phase, int ctas, int c) {
  return PhaseTiles(d, phase, ctas, c) * kDecodeTileBytes;
}

constexpr DecodePhase kLayerPhases[] = {DecodePhase::kMixerIn, DecodePhase::kMixerOut,
                                        DecodePhase::kMlpIn, DecodePhase::kMlpOut};

class CudaPersistentDecode : public PersistentDecode {
 public:
  CudaPersistentDecode(Backend* backend, cudaStream_t stream)
      : backend_(backend), stream_(stream) {}

  absl::Status Build(const PersistentDecodeModel& m) {
    PersistentDecodeDims& d = params_.dims;
    d.layers = static_cast<int>(m.layers.size());
    if (d.layers == 0 || !m.embedding.defined() || m.embedding.shape().size() != 2)
      return absl::UnimplementedError("persistent decode: no layers or no embedding");
    d.vocab = static_cast<int>(m.embedding.dim(0));
    d.hidden = static_cast<int>(m.embedding.dim(1));
    d.heads = m.heads, d.dk = m.dk, d.dv = m.dv, d.rank = m.rank;
    d.ffn = m.layers[0].up.defined() ? static_cast<int>(m.layers[0].up.dim(0)) : 0;
    d.output_gate = m.layers[0].g.defined();
    params_.ctas = PersistentDecodeCtas();
    if (!PersistentDecodeSupports(d, params_.ctas))
      return absl::UnimplementedError("persistent decode: shapes outside the kernel's");
    int device = 0, major = 0;
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "device"));
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "device"));
    if (major < 9) return absl::UnimplementedError("persistent decode: needs sm_90");
    LAIR_RETURN_IF_ERROR(CheckWeights(m));
    params_.block_eps = m.block_eps, params_.head_eps = m.head_eps;
    params_.gate_scale = m.gate_scale;
    params_.q_scale = 1.0f / std::sqrt(static_cast<float>(d.dk));
    LAIR_RETURN_IF_ERROR(BuildStream(m));
    LAIR_RETURN_IF_ERROR(BuildLayers(m));
    // The work buffers, each on a 64-byte boundary (the kernel reads float4s).
    const auto padded = [](int64_t n) { return (n + 15) / 16 * 16; };
    // (floats: y's words take two, the argmax key two.)
    const int64_t sizes[] = {
        d.hidden, d.hidden, 2 * d.MixerInRows(), 2 * d.heads * d.hidden, 2 * d.heads, 2, 1};
    int64_t total = 0;
    for (int64_t n : sizes) total += padded(n);
    LAIR_ASSIGN_OR_RETURN(work_, backend_->Allocate(DType::kF32, {total}));
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(work_.raw(), 0, total * sizeof(float), stream_), "zero"));
    // The buffers in the order of `sizes`.
    float* at = work_.f32();
    const int64_t* size = sizes;
    const auto take = [&] {
      float* buffer = at;
      at += padded(*size++);
      return buffer;
    };
    params_.x[0] = take();
    params_.x[1] = take();
    params_.y = reinterpret_cast<unsigned long long*>(take());
    params_.mixer_sums = take();
    params_.head_sq = take();
    params_.best = reinterpret_cast<unsigned long long*>(take());
    params_.arrivals = reinterpret_cast<unsigned*>(take());
    LAIR_RETURN_IF_ERROR(CudaStatus(ConfigurePersistentDecode(params_), "configure"));
    LAIR_ASSIGN_OR_RETURN(logits_, backend_->Allocate(DType::kF32, {1, d.vocab}));
    params_.logits = logits_.f32();
    params_.embedding = m.embedding.f32();
    params_.final_norm = m.final_norm.defined() ? m.final_norm.f32() : nullptr;
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Step(int32_t token, int slot, std::span<const Tensor> states,
                              const Tensor& ids) override {
    const PersistentDecodeDims& d = params_.dims;
    if (token < 0 || token >= d.vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("persistent decode: token ", token, " outside the vocabulary"));
    if (ids.defined() &&
        (ids.device() != Device::kCuda || ids.dtype() != DType::kI32 || ids.numel() != 1))
      return absl::InvalidArgumentError("persistent decode: ids is not a CUDA I32 [1] tensor");
    if (static_cast<int>(states.size()) != d.layers)
      return absl::InvalidArgumentError(
          absl::StrCat("persistent decode: ", states.size(), " states for ", d.layers, " layers"));
    for (const Tensor& s : states) {
      if (s.dtype() != DType::kF32 || s.shape().size() != 4 || s.dim(1) != d.heads ||
          s.dim(2) != d.dk || s.dim(3) != d.dv || s.dim(0) != states[0].dim(0))
        return absl::InvalidArgumentError(
            "persistent decode: a state is not [slots, H, dk, dv] F32");
    }
    if (slot < 0 || slot >= states[0].dim(0))
      return absl::InvalidArgumentError(
          absl::StrCat("persistent decode: slot ", slot, " out of range"));
    LAIR_RETURN_IF_ERROR(BindStates(states));
    params_.token = token;
    params_.slot = slot;
    params_.ids = ids.defined() ? ids.data<int32_t>() : nullptr;
    LAIR_RETURN_IF_ERROR(CudaStatus(LaunchPersistentDecode(params_, stream_), "launch"));
    params_.arrival_base += PersistentDecodeArrivals(params_);
    // y's flags must never repeat while a stale word could carry one: at
    // the wrap, zero y (flag 0, which no layer uses) and start again.
    params_.y_flag_base += d.layers;
    if (params_.y_flag_base > UINT32_MAX - 2u * d.layers) {
      params_.y_flag_base = 0;
      LAIR_RETURN_IF_ERROR(CudaStatus(
          cudaMemsetAsync(params_.y, 0, sizeof(uint64_t) * d.MixerInRows(), stream_), "zero y"));
    }
    return logits_;
  }

 private:
  absl::Status CheckWeights(const PersistentDecodeModel& m) const {
    const PersistentDecodeDims& d = params_.dims;
    const int64_t hk = d.heads * d.dk, hv = d.heads * d.dv;
    if (m.embedding.dtype() != DType::kF32)
      return absl::UnimplementedError("persistent decode: the embedding is not F32");
    LAIR_RETURN_IF_ERROR(ExpectMatrix(m.lm_head, d.vocab, d.hidden, "lm_head"));
    LAIR_RETURN_IF_ERROR(ExpectVector(m.final_norm, d.hidden, "the final norm"));
    for (const PersistentDecodeLayer& l : m.layers) {
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.q, hk, d.hidden, "q"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.k, hk, d.hidden, "k"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.v, hv, d.hidden, "v"));
      if (l.g.defined() != d.output_gate)
        return absl::UnimplementedError("persistent decode: layers differ in their output gate");
      if (d.output_gate) LAIR_RETURN_IF_ERROR(ExpectMatrix(l.g, hv, d.hidden, "g"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.gate_in, d.rank, d.hidden, "gk_proj.0"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.gate_out, hk, d.rank, "gk_proj.1"));
      LAIR_RETURN_IF_ERROR(ExpectVector(l.gate_bias, hk, "gk_proj.1's bias"));
      LAIR_RETURN_IF_ERROR(ExpectVector(l.head_norm, d.dv, "the head norm"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.o, d.hidden, hv, "o_proj"));
      LAIR_RETURN_IF_ERROR(ExpectVector(l.mixer_norm, d.hidden, "the mixer norm"));
      LAIR_RETURN_IF_ERROR(ExpectVector(l.mlp_norm, d.hidden, "the MLP norm"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.up_gate, d.ffn, d.hidden, "the MLP gate"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.up, d.ffn, d.hidden, "the MLP up"));
      LAIR_RETURN_IF_ERROR(ExpectMatrix(l.down, d.hidden, d.ffn, "the MLP down"));
    }
    return absl::OkStatus();
  }

  // A bf16 device matrix's bits on the host.
  absl::StatusOr<std::vector<uint16_t>> Host(const Tensor& t) {
    LAIR_ASSIGN_OR_RETURN(Tensor host, backend_->Download(t));
    const auto* data = static_cast<const uint16_t*>(host.raw());
    return std::vector<uint16_t>(data, data + host.numel());
  }

  // Every CTA's tiles, phase after phase, layer after layer, then the head.
  absl::Status BuildStream(const PersistentDecodeModel& m) {
    const PersistentDecodeDims& d = params_.dims;
    const int ctas = params_.ctas;
    std::vector<int64_t> layer_bytes(ctas), offsets(ctas + 1, 0);
    for (int c = 0; c < ctas; ++c) {
      for (DecodePhase phase : kLayerPhases) layer_bytes[c] += PhaseBytes(d, phase, ctas, c);
      offsets[c + 1] =
          offsets[c] + d.layers * layer_bytes[c] + PhaseBytes(d, DecodePhase::kHead, ctas, c);
    }
    Tensor host_stream = Tensor::Zeros(DType::kBF16, {offsets[ctas] / 2});
    auto* stream = static_cast<uint16_t*>(host_stream.raw());
    const auto write = [&](int64_t at_layer, DecodePhase phase, const HostRows& rows) {
      ParallelFor(ctas, 0, [&](int64_t cta) {
        const int c = static_cast<int>(cta);
        int64_t at =
            offsets[c] + (at_layer < 0 ? d.layers * layer_bytes[c] : at_layer * layer_bytes[c]);
        for (DecodePhase before : kLayerPhases) {
          if (at_layer < 0 || before == phase) break;
          at += PhaseBytes(d, before, ctas, c);
        }
        WriteTiles(d, phase, rows, ctas, c, stream + at / 2);
      });
    };
    for (int l = 0; l < d.layers; ++l) {
      const PersistentDecodeLayer& layer = m.layers[l];
      std::vector<std::vector<uint16_t>> in;
      for (const Tensor* t : {&layer.q, &layer.k, &layer.v, &layer.g, &layer.gate_in}) {
        if (!t->defined()) continue;
        LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> rows, Host(*t));
        in.push_back(std::move(rows));
      }
      HostRows mixer_in{{}, d.hidden};
      for (const std::vector<uint16_t>& rows : in)
        mixer_in.parts.push_back({rows.data(), static_cast<int64_t>(rows.size()) / d.hidden});
      write(l, DecodePhase::kMixerIn, mixer_in);
      LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> o, Host(layer.o));
      write(l, DecodePhase::kMixerOut, HostRows{{{o.data(), d.hidden}}, d.heads * d.dv});
      LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> gate, Host(layer.up_gate));
      LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> up, Host(layer.up));
      write(l, DecodePhase::kMlpIn, HostRows{{{gate.data(), d.ffn}, {up.data(), d.ffn}}, d.hidden});
      LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> down, Host(layer.down));
      write(l, DecodePhase::kMlpOut, HostRows{{{down.data(), d.hidden}}, d.ffn});
    }
    LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> head, Host(m.lm_head));
    write(-1, DecodePhase::kHead, HostRows{{{head.data(), d.vocab}}, d.hidden});

    LAIR_ASSIGN_OR_RETURN(weights_, backend_->Upload(host_stream, DType::kBF16));
    Tensor host_offsets = Tensor::Zeros(DType::kI64, {ctas + 1});
    std::memcpy(host_offsets.raw(), offsets.data(), offsets.size() * sizeof(int64_t));
    LAIR_ASSIGN_OR_RETURN(stream_offsets_, backend_->Upload(host_offsets, DType::kI64));
    params_.stream = static_cast<const uint8_t*>(weights_.raw());
    params_.stream_offsets = static_cast<const int64_t*>(stream_offsets_.raw());
    return absl::OkStatus();
  }

  // The layers' small operands: gk_proj.1 and its bias in fp32, the norms.
  absl::Status BuildLayers(const PersistentDecodeModel& m) {
    const PersistentDecodeDims& d = params_.dims;
    const int64_t hk = d.heads * d.dk, per_layer = hk * d.rank + hk;
    Tensor host = Tensor::Zeros(DType::kF32, {d.layers * per_layer});
    for (int l = 0; l < d.layers; ++l) {
      const PersistentDecodeLayer& layer = m.layers[l];
      LAIR_ASSIGN_OR_RETURN(std::vector<uint16_t> w, Host(layer.gate_out));
      float* out = host.f32() + l * per_layer;
      for (int64_t i = 0; i < hk * d.rank; ++i) out[i] = BF16ToFloat(w[i]);
      if (layer.gate_bias.defined()) {
        LAIR_ASSIGN_OR_RETURN(Tensor bias, backend_->Download(layer.gate_bias));
        std::memcpy(out + hk * d.rank, bias.f32(), hk * sizeof(float));
      }
    }
    LAIR_ASSIGN_OR_RETURN(gates_, backend_->Upload(host, DType::kF32));
    layers_.resize(d.layers);
    for (int l = 0; l < d.layers; ++l) {
      const PersistentDecodeLayer& layer = m.layers[l];
      PersistentDecodeLayerRefs& out = layers_[l];
      out.gate = gates_.f32() + l * per_layer;
      out.mixer_norm = layer.mixer_norm.defined() ? layer.mixer_norm.f32() : nullptr;
      out.head_norm = layer.head_norm.defined() ? layer.head_norm.f32() : nullptr;
      out.mlp_norm = layer.mlp_norm.defined() ? layer.mlp_norm.f32() : nullptr;
    }
    return absl::OkStatus();
  }

  // Points the layers at the pool's state tensors (uploaded again only when
  // the pool moves).
  absl::Status BindStates(std::span<const Tensor> states) {
    bool same = layer_refs_.defined();
    for (size_t l = 0; l < states.size(); ++l) same &= layers_[l].state == states[l].f32();
    if (same) return absl::OkStatus();
    for (size_t l = 0; l < states.size(); ++l) layers_[l].state = states[l].f32();
    params_.state_slot_stride = states[0].numel() / states[0].dim(0);
    const int64_t bytes = static_cast<int64_t>(layers_.size() * sizeof(PersistentDecodeLayerRefs));
    static_assert(sizeof(PersistentDecodeLayerRefs) % sizeof(int64_t) == 0);
    Tensor host = Tensor::Zeros(DType::kI64, {bytes / static_cast<int64_t>(sizeof(int64_t))});
    std::memcpy(host.raw(), layers_.data(), bytes);
    LAIR_ASSIGN_OR_RETURN(layer_refs_, backend_->Upload(host, DType::kI64));
    params_.layer = static_cast<const PersistentDecodeLayerRefs*>(layer_refs_.raw());
    return absl::OkStatus();
  }

  Backend* backend_;
  cudaStream_t stream_;
  PersistentDecodeParams params_;
  std::vector<PersistentDecodeLayerRefs> layers_;  // host copy of layer_refs_
  Tensor weights_, stream_offsets_, gates_, layer_refs_, work_, logits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PersistentDecode>> MakeCudaPersistentDecode(
    Backend* backend, cudaStream_t stream, const PersistentDecodeModel& model) {
  auto program = std::make_unique<CudaPersistentDecode>(backend, stream);
  LAIR_RETURN_IF_ERROR(program->Build(model));
  return program;
}

}  // namespace lair::kernels::cuda
