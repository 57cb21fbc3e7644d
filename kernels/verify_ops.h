// Checking a backend's mixer kernels against the golden ops fixtures
// (shared/fixtures/ops, described in fixtures/README.md): the engine of
// `lair verify ops`, also used by the kernel tests.
//
// DIR/manifest.json maps op names to {kind, scale or eps}; DIR/<name>.safetensors
// holds the inputs in [B, T, H, ...] layout, the initial and final states, the
// incoming gradients and the reference gradients. Every op is run on the
// backend as B packed sequences of length T (sequence b in slot b): the
// chunked and the recurrent forward (output and final states), then the
// backward (every input gradient the fixture holds). All shapes come from the
// tensors, so held-out fixtures of other sizes work unchanged.
//
// Thread safety: functions keep no state; the backend is used by one thread.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace lair::kernels {

// One op of the manifest.
struct OpSpec {
  std::string name;   // the fixture file is <name>.safetensors
  std::string kind;   // no_decay, constant_decay, scalar_decay, vector_decay,
                      // left_right_decay, gsa, mlstm_exp, mlstm_sig, mlstm_sig_norm
  float scale = 0;    // decay and gsa ops: applied to q (absent: K^-1/2)
  float eps = 1e-6f;  // mlstm ops
};

// One compared tensor.
struct TensorCheck {
  std::string label;          // "chunked o", "recurrent ht", "backward dq", ...
  double relative_error = 0;  // ‖ours − ref‖₂ / ‖ref‖₂
  double tolerance = 0;
  Tensor values;  // ours, as an F32 host tensor
  // For 16-bit activations (AddRoundingFloor): the error of the exact F32
  // computation on the same rounded inputs against the reference (the floor
  // that rounding alone sets), and ours against that computation (the
  // kernel's own error). Negative: not measured.
  double floor = -1;
  double own_error = -1;
  // Within tolerance of the reference, or, where rounding the inputs alone
  // uses up more than half the tolerance, within tolerance of the exact
  // computation on them.
  bool at_floor() const {
    return relative_error > tolerance && floor > tolerance / 2 && own_error >= 0 &&
           own_error <= tolerance;
  }
  bool passed() const { return relative_error <= tolerance || at_floor(); }
};

struct OpReport {
  OpSpec spec;
  std::vector<TensorCheck> checks;
  // Why the op could not be run to the end (missing tensor, backend error);
  // the checks made before the failure are kept.
  absl::Status status;
  bool passed() const;
};

struct VerifyOpsOptions {
  // Element type of the activations (q, k, v, o and their gradients) on the
  // backend: kF32 or kBF16. Gates and states stay F32.
  DType dtype = DType::kF32;
  int chunk_size = 64;
  // Feed the activations rounded to `dtype` but as F32 tensors, and take F32
  // outputs: an F32 backend then computes exactly what a `dtype` run reads.
  bool rounded_in_f32 = false;
};

// The tolerances of fixtures/README.md for `dtype`: outputs and states,
// gradients.
double OutputTolerance(DType dtype);
double GradientTolerance(DType dtype);

// Reads DIR/manifest.json; entries whose name starts with '_' are notes, not
// ops. Ops come back in manifest order.
absl::StatusOr<std::vector<OpSpec>> ReadOpsManifest(const std::string& dir);

// Runs one op from DIR/<spec.name>.safetensors on `backend`. Never fails as a
// whole: problems are reported in OpReport::status.
OpReport VerifyOp(Backend& backend, const std::string& dir, const OpSpec& spec,
                  const VerifyOpsOptions& options);

// For 16-bit activations: runs the op again on `exact` (an F32 backend, the
// CPU's) with the same rounded inputs in F32 and fills each check's floor
// and own_error. A fixture can be so sensitive to its inputs that rounding
// them to bf16 alone reaches the tolerance (mlstm_exp's dq and dk: 5.0e-2
// and 5.3e-2 against 5e-2, which a float64 computation on the rounded inputs
// confirms); such a check is then judged against the exact result on the
// rounded inputs instead. Does nothing for F32 activations.
void AddRoundingFloor(Backend& exact, const std::string& dir, const VerifyOpsOptions& options,
                      OpReport& report);

}  // namespace lair::kernels
