#!/usr/bin/env bash
# Builds LAIR and runs every test (idempotent; reuses build/ and ccache).
# Usage: scripts/test.sh            main build (server on, CUDA compiled when nvcc exists)
#        scripts/test.sh --asan     the same tests under AddressSanitizer + UBSan (build-asan/)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
export CCACHE_BASEDIR="$PWD"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"

if [ "${1:-}" = "--asan" ]; then
  # Sanitizers need no GPU code or network stack to find host-side bugs;
  # leaving them out halves the build on small machines.
  build=build-asan
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLAIR_SANITIZE=ON \
    -DLAIR_WITH_SERVER=OFF -DLAIR_WITH_CUDA=OFF >/dev/null
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  build=build
  # Release, as the Docker image and the GPU machines build: warnings that
  # only -O3 raises fail here rather than there.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAIR_WITH_SERVER=ON >/dev/null
fi
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
