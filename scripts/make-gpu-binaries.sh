#!/usr/bin/env bash
# Builds here what a device call runs, so that the call spends its device
# time on the GPU rather than on a build (about 70 s of a 30-minute budget):
# `lair` and the CUDA test binaries in the device's configuration (Release,
# no network front ends, sm_90), stripped and packed into .carry/bin.tar.xz,
# and the shared libraries they load that the device lacks (Debian's absl,
# OpenBLAS, ICU, PCRE2; not glibc, libstdc++ or CUDA's own) into
# .carry/rt.tar.xz. scripts/gpu-check.sh's `unpack` stage lays them out there.
#
# OLD_REV=REV also packs that revision's `lair`, built in a worktree, into
# .carry/old-bin.tar.xz, which scripts/gpu-ab.sh then runs as its old binary.
# Run from anywhere after scripts/install-deps.sh; reuses build-dev/ and ccache.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD" CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
targets=(lair kernels_cuda_scan_mma_test kernels_cuda_decay_grad_test kernels_cuda_backend_test
  kernels_cuda_dense_test kernels_cuda_step_test models_test)

# Configures and builds targets $2... of the tree at $1 in $1/build-dev.
build() {
  local tree=$1
  shift
  cmake -S "$tree" -B "$tree/build-dev" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAIR_WITH_SERVER=OFF \
    -DLAIR_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  ninja -C "$tree/build-dev" "$@"
}

# Strips binaries $2... of folder $1 into one solid archive $3: they share
# the CUDA kernels, so each one after the first adds little.
pack() {
  local from=$1 archive=$2 staging
  shift 2
  staging=$(mktemp -d)
  for t in "$@"; do strip -o "$staging/$t" "$from/$t"; done
  tar -C "$staging" -cf - . | xz -9 -T0 >"$archive"
  rm -rf "$staging"
}

mkdir -p .carry
build "$PWD" "${targets[@]}"
pack build-dev/bin .carry/bin.tar.xz "${targets[@]}"

runtime=$(mktemp -d)
for t in "${targets[@]}"; do ldd "build-dev/bin/$t"; done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
  sort -u | grep -Ev '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt)\.so|/usr/local/cuda' |
  while read -r lib; do cp -L "$lib" "$runtime/"; done
tar -C "$runtime" -cf - . | xz -9 -T0 >.carry/rt.tar.xz
rm -rf "$runtime"

if [ -n "${OLD_REV:-}" ]; then
  old=$(mktemp -d)
  git worktree add --detach "$old/tree" "$OLD_REV" >/dev/null
  (export CCACHE_BASEDIR="$old/tree" && build "$old/tree" lair)
  pack "$old/tree/build-dev/bin" .carry/old-bin.tar.xz lair
  git worktree remove --force "$old/tree"
  rm -rf "$old"
fi
du -h .carry/*.tar.xz
