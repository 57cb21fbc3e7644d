// The tensor-core path of LaunchScan (scan.h) for bf16/f16 operands: chunks of
// 64 tokens, bf16 mma.sync with fp32 accumulation, fp32 state. LaunchScan
// dispatches here whenever ScanMmaSupports holds; the fp32 kernel of scan.cu
// serves everything else (f32 operands, right decays, odd dims).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// q, k and v bf16 or f16 and 16-byte aligned, dk ≤ 256 and dv multiples of 16,
// no right decay, and the tile fits in shared memory. Any left decay (none,
// scalar, vector), reverse order, shifted gates and the mLSTM fields are served.
bool ScanMmaSupports(const ScanParams& p);

// Requires ScanMmaSupports(p) and p.num_seqs > 0.
cudaError_t LaunchScanMma(const ScanParams& p, cudaStream_t stream);

// The two-pass form of the same scan, for launches with too few (sequence,
// head, tile) CTAs to fill the GPU while each walks its chunks in order (a
// prefill of one long prompt). The state pass walks the chunks running only
// the state update, and stores the bf16 S entering every chunk, the one
// rounding the scan makes of it; the output pass then computes every chunk in
// a CTA of its own from that copy. Its outputs equal LaunchScanMma's.
//
// Forward scans without the mLSTM fields (reverse, stabilize, norm,
// key_weight, n_init, n_final unset) and that ScanMmaSupports.
bool ScanMmaTwoPassSupports(const ScanParams& p);
// Entries of the chunk-state buffer for `tokens` packed tokens in `num_seqs`
// sequences; each entry is [heads][dk][dv] bf16, 16-byte aligned.
int64_t ScanMmaChunkStates(int64_t tokens, int num_seqs);
// The state pass: writes the chunk states and s_final (p.o is not read or
// written); with chunk_states null, s_final alone (the segmented schedule's
// local final states, scan_segments.h). Each state row evolves alone, so p may also be a key-block
// view of the scan (its heads the (head, block) pairs, ScanParams::v_head_share); the buffer's
// layout is the same.
cudaError_t LaunchScanMmaStates(const ScanParams& p, void* chunk_states, cudaStream_t stream);
// The output pass: writes p.o from the chunk states (s_init and s_final are
// not read or written); max_len is the longest sequence.
cudaError_t LaunchScanMmaOutputs(const ScanParams& p, const void* chunk_states, int max_len,
                                 cudaStream_t stream);

}  // namespace lair::kernels::cuda
