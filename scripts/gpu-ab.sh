#!/bin/bash
# Same-call A/B on the device: this tree's build (build-gpu, from
# `STAGES=build scripts/gpu-check.sh`) against the same build with the files
# under .carry/old laid over the tree, alternating the two binaries on the
# same random checkpoints so both see the same GPU state.
#
# The old binary is .carry/old-bin.tar.xz's, when there is one
# (`OLD_REV=REV scripts/make-gpu-binaries.sh` builds it where apt works, with
# this tree's binaries for the `unpack` stage). Otherwise it is built in
# place: the files under .carry/old are laid over the tree, `lair` is rebuilt
# incrementally (only what they touch), copied out, and this tree's files are
# put back and rebuilt. Fill .carry/old here before the call with the files
# of the revision to compare against (files that revision lacks cannot be
# expressed), e.g.
#   git diff --name-only REV | while read -r f; do
#     mkdir -p ".carry/old/$(dirname "$f")"; git show "REV:$f" >".carry/old/$f"; done
#
# AB_OLD_ENV instead compares this tree's binary with itself: its old runs
# get that environment (e.g. "LAIR_AB_GEMV_BULK=1", a switch an experiment
# reads), as its new runs get AB_NEW_ENV; no old binary is needed then.
#
# AB_PRESETS (default gla-1.3b), AB_RUNS (';'-separated `lair bench`
# arguments, e.g. "decode --batch 16 --prompt-len 512 --gen-len 128"),
# AB_ROUNDS (default 2; even rounds run the new binary first). Prints one
# line per run: which binary, the preset and the bench's summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
LIB=/tmp/debroot/usr/lib/x86_64-linux-gnu
# The unpack stage's libraries, or the build stage's.
export LD_LIBRARY_PATH=/tmp/lair-rt:/usr/local/cuda/lib64:$LIB:$LIB/openblas-pthread
OLD=/tmp/old-lair
[ -x build-gpu/bin/lair ] || { echo "build-gpu/bin/lair missing: run the build or unpack stage first"; exit 1; }
if [ -n "${AB_OLD_ENV:-}" ]; then
  OLD=build-gpu/bin/lair
elif [ ! -x $OLD ] && [ -f .carry/old-bin.tar.xz ]; then
  mkdir -p /tmp/old-bin && tar -xJf .carry/old-bin.tar.xz -C /tmp/old-bin && cp /tmp/old-bin/lair $OLD
fi
if [ ! -x $OLD ]; then
  [ -d .carry/old ] || { echo ".carry/old and .carry/old-bin.tar.xz missing: nothing to compare against"; exit 1; }
  mapfile -t files < <(cd .carry/old && find . -type f | sed 's|^\./||')
  saved=$(mktemp -d)
  for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "$f: not in this tree"; exit 1; }
    mkdir -p "$saved/$(dirname "$f")" && cp "$f" "$saved/$f"
  done
  cp -r .carry/old/. .
  ninja -C build-gpu lair >/tmp/old-build.txt 2>&1 && cp build-gpu/bin/lair $OLD
  # Plain copies give the restored files new times, so ninja rebuilds them.
  cp -r "$saved"/. .
  ninja -C build-gpu lair >>/tmp/old-build.txt 2>&1 || { tail -20 /tmp/old-build.txt; exit 1; }
  [ -x $OLD ] || { tail -20 /tmp/old-build.txt; exit 1; }
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
        bin=build-gpu/bin/lair env_vars=${AB_NEW_ENV:-}
        [ "$which" = old ] && bin=$OLD env_vars=${AB_OLD_ENV:-}
        # shellcheck disable=SC2086 # $run holds several arguments, $env_vars assignments
        echo "$which $preset: $(env $env_vars timeout 120 $bin bench $run --model "$model" --device cuda --dtype bf16 2>&1 |
          grep '^lair bench' | sed 's/.*gemm=[a-z]* //')"
      done
    done
  done
done
