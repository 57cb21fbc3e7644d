#!/bin/bash
# Same-call A/B on the device: this tree's build (build-gpu, from
# `STAGES=build scripts/gpu-check.sh`) against a build of the tree with the
# files under .carry/old laid over it, alternating the two binaries on the
# same random checkpoints so both see the same GPU state.
#
# Fill .carry/old here before the call with the files of the revision to
# compare against, e.g.
#   git diff --name-only REV | while read -r f; do
#     mkdir -p ".carry/old/$(dirname "$f")"; git show "REV:$f" >".carry/old/$f"; done
#
# AB_PRESETS (default gla-1.3b), AB_RUNS (';'-separated `lair bench`
# arguments, e.g. "decode --batch 16 --prompt-len 512 --gen-len 128"),
# AB_ROUNDS (default 2; even rounds run the new binary first). Prints one
# line per run: which binary, the preset and the bench's summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
HERE=$PWD
LIB=/tmp/debroot/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread
[ -x build-gpu/bin/lair ] || { echo "build-gpu/bin/lair missing: run the build stage first"; exit 1; }
[ -d .carry/old ] || { echo ".carry/old missing: nothing to compare against"; exit 1; }
if [ ! -x /tmp/old/build-gpu/bin/lair ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old
  tar --exclude=./build-gpu --exclude=./.carry --exclude=./.whl --exclude=./build \
    --exclude=./build-asan -cf - . | tar -xf - -C /tmp/old
  cp -r .carry/old/. /tmp/old/
  ln -s "$HERE/.carry" /tmp/old/.carry
  (cd /tmp/old && STAGES=build OUT=/tmp/old-out bash scripts/gpu-check.sh >/tmp/old-build.txt 2>&1)
  [ -x /tmp/old/build-gpu/bin/lair ] || { tail -20 /tmp/old-build.txt; exit 1; }
fi
for preset in ${AB_PRESETS:-gla-1.3b}; do
  model=/tmp/ab-model-$preset
  [ -d "$model" ] || build-gpu/bin/lair init --preset "$preset" --dtype bf16 --out "$model" >/dev/null
  IFS=';' read -ra runs <<<"${AB_RUNS:?AB_RUNS names the runs}"
  for run in "${runs[@]}"; do
    for round in $(seq "${AB_ROUNDS:-2}"); do
      # Rounds alternate which binary goes first, so that a drift of the
      # GPU's clocks over a pair does not favour one side.
      order="old new"
      [ $((round % 2)) = 0 ] && order="new old"
      for which in $order; do
        bin=build-gpu/bin/lair
        [ "$which" = old ] && bin=/tmp/old/build-gpu/bin/lair
        # shellcheck disable=SC2086 # $run holds several arguments
        echo "$which $preset: $(timeout 120 $bin bench $run --model "$model" --device cuda --dtype bf16 2>&1 |
          grep '^lair bench' | sed 's/.*gemm=[a-z]* //')"
      done
    done
  done
done
