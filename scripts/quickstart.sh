#!/usr/bin/env bash
# The README's first command: install packages, build `lair`, write a small
# demo model with a byte-level tokenizer (no downloads), and serve it.
# Idempotent: reuses build/ and the demo model when they exist.
# Environment: LAIR_DEMO_DIR (default demo-model/), LAIR_HTTP_PORT (8000),
# LAIR_GRPC_PORT (50051), LAIR_HOST (127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
export CCACHE_BASEDIR="$PWD" CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAIR_WITH_SERVER=ON >/dev/null
cmake --build build -j "$(nproc)" --target lair

demo="${LAIR_DEMO_DIR:-demo-model}"
if [ ! -f "$demo/model.safetensors" ]; then
  build/bin/lair init --family gla --preset tiny --byte-tokenizer --seed 1 --out "$demo"
fi
device=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda; fi
exec build/bin/lair serve --model "$demo" --served-model-name demo --device "$device" \
  --host "${LAIR_HOST:-127.0.0.1}" --http-port "${LAIR_HTTP_PORT:-8000}" \
  --grpc-port "${LAIR_GRPC_PORT:-50051}"
