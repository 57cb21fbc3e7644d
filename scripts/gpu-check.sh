#!/usr/bin/env bash
# One device call: build LAIR with CUDA, run the CUDA tests, check the CUDA
# backend and models against the golden fixtures (f32 and bf16), time our
# kernels and models and the reference ones side by side, print a table.
#
# Runs in the repository root of a GPU machine that has CUDA, CMake, ninja
# and PyTorch/Triton but none of our Debian -dev packages and no network;
# scripts/make-gpu-carry.sh prepares what the call carries (.carry, .whl).
# Logs go to $OUT (or ./gpu-check-out).
#
# STAGES (default all but unpack): build test verify models bench ref model profile hf
#   unpack  instead of build: lay out the binaries scripts/make-gpu-binaries.sh built
#           where apt works (.carry/bin.tar.xz into BUILD/bin, .carry/rt.tar.xz's
#           libraries onto the library path), and check that lair runs here
#   build   configure (server off) and build lair and the CUDA test binaries
#           (in BUILD, default build-gpu; CUDA_FLAGS adds nvcc flags, e.g. -lineinfo;
#           BUILD_TARGETS replaces the targets, e.g. "lair" alone)
#   test    the CUDA unit tests (scan, decay gradient, backend vs CPU and the
#           op fixtures, dense ops, decode-step machinery, every family's tiny
#           model through CUDA graphs)
#   verify  `lair verify ops --device cuda --dtype f32|bf16`
#   models  `lair verify model --device cuda --dtype f32|bf16` on the fixture models
#   bench   `lair bench kernels $BENCH_KERNELS_ARGS`
#   ref     scripts/bench_reference.py, one process per op of REF_OPS, at
#           REF_SEQ_LENS and REF_MODES, each under REF_TIMEOUT seconds
#   model   `lair bench decode|prefill` on random bf16 checkpoints of each
#           MODEL_PRESETS shape (BENCH_ARGS adds flags, e.g. "--no-graphs"; MODEL_RUNS,
#           ';'-separated, replaces the four default runs)
#   profile one decode step's kernels under Nsight Compute (PROFILE_PRESET, PROFILE_BATCHES;
#           PROFILE_CACHE=none keeps the caches warm between kernels, as in a replayed step;
#           PROFILE_LIST=1 lists the step's kernels in order with their DRAM bytes;
#           PROFILE_PREFILL=P adds a P-token prefill; PROFILE_KERNEL=REGEX adds Nsight's
#           throughput, occupancy, launch, warp-state and memory sections for the first
#           PROFILE_KERNEL_COUNT (default 6) decode launches of kernels matching REGEX)
#   hf      scripts/bench_hf_baseline.py: HF generate + fla, GLA 1.3B shape
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build test verify models bench ref model profile hf"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
ROOT=/tmp/debroot
LIB=$ROOT/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread:${LD_LIBRARY_PATH:-}
BUILD=${BUILD:-build-gpu}  # another folder keeps a second configuration (CUDA_FLAGS) beside it
LAIR=$BUILD/bin/lair
status() { echo "== $* ($(date +%T))"; }
# Prints a test binary's failures and its summary line.
gtest() {
  local name=$1 limit=$2
  shift 2
  [ -x "$BUILD/bin/$name" ] || { echo "$name: not built"; return; }
  timeout "$limit" env LAIR_FIXTURES="$PWD/.carry" "$BUILD/bin/$name" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: exit $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E -A4 "Failure$|^\[  FAILED  \].*\(" "$OUT/$name.log" | head -30
}

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader

if has unpack; then
  status unpack
  mkdir -p "$BUILD/bin" /tmp/lair-rt
  tar -xJf .carry/bin.tar.xz -C "$BUILD/bin" && tar -xJf .carry/rt.tar.xz -C /tmp/lair-rt
  export LD_LIBRARY_PATH=/tmp/lair-rt:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
  $LAIR --help >/dev/null || { echo "the unpacked lair does not run here: use the build stage"; exit 1; }
fi

if has build; then
  status build
  if [ ! -d $ROOT/usr ]; then
    mkdir -p $ROOT && tar -xJf .carry/debroot.tar.xz -C $ROOT
  fi
  export PKG_CONFIG_LIBDIR=$LIB/pkgconfig:$ROOT/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$ROOT
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAIR_WITH_SERVER=OFF -DLAIR_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS="${CUDA_FLAGS:-}" -DCMAKE_PREFIX_PATH="$ROOT/usr;$LIB/cmake;$ROOT/usr/share/cmake" \
    -DICU_ROOT=$ROOT/usr -DPKG_CONFIG_EXECUTABLE=$ROOT/usr/bin/pkg-config \
    -DCMAKE_CXX_FLAGS="-isystem $ROOT/usr/include -isystem $ROOT/usr/include/x86_64-linux-gnu/openblas-pthread" \
    -DBLAS_LIBRARIES="$LIB/openblas-pthread/libopenblas.so" -DLAIR_DEFAULT_FIXTURES="$PWD/.carry" \
    >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  # shellcheck disable=SC2086 # BUILD_TARGETS holds several targets
  ninja -C $BUILD -j"$(nproc)" -k 0 ${BUILD_TARGETS:-lair kernels_cuda_scan_mma_test \
    kernels_cuda_decay_grad_test kernels_cuda_backend_test kernels_cuda_dense_test \
    kernels_cuda_step_test models_test} \
    >>"$OUT/build.log" 2>&1 || { echo "build failed:"; grep -A6 -m6 "error" "$OUT/build.log"; }
fi

if has test; then
  status test
  gtest kernels_cuda_scan_mma_test 150
  gtest kernels_cuda_decay_grad_test 60
  gtest kernels_cuda_backend_test 240
  echo "fixture checks passed: $(grep -c '^fixture.* ok$' "$OUT/kernels_cuda_backend_test.log")," \
    "failed: $(grep -c '^fixture.* FAIL$' "$OUT/kernels_cuda_backend_test.log")"
  grep '^fixture.* FAIL$' "$OUT/kernels_cuda_backend_test.log"
  gtest kernels_cuda_dense_test 120
  gtest kernels_cuda_step_test 60
  gtest models_test 240 --gtest_filter='AllFamilies/CudaStep*:*PersistentDecode*'
fi

if has verify && [ -x $LAIR ]; then
  for dt in f32 bf16; do
    status verify ops $dt
    timeout 60 $LAIR verify ops --dir .carry/ops --device cuda --dtype $dt >"$OUT/verify_$dt.log" 2>&1
    echo "exit $?: $(tail -1 "$OUT/verify_$dt.log")"
    grep -E "FAIL" "$OUT/verify_$dt.log" | head -10
  done
fi

if has models && [ -x $LAIR ]; then
  # fp32 at the fp32 tolerances, bf16 weights at the bf16 ones (no gradients:
  # the carry leaves the gradient goldens out).
  status verify models
  for dt in f32 bf16; do
    for m in .carry/models/*/; do
      timeout 120 $LAIR verify model --model "$m" --device cuda --dtype $dt --no-grads >>"$OUT/verify_models.log" 2>&1
      echo "$dt $(basename "$m"): exit $? $(tail -1 "$OUT/verify_models.log")"
    done
  done
fi

if has bench && [ -x $LAIR ]; then
  status bench kernels
  timeout ${BENCH_TIMEOUT:-200} $LAIR bench kernels ${BENCH_KERNELS_ARGS:-} 2>&1 | tee "$OUT/bench_lair.log"
fi

if has ref; then
  status reference
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
  # One process per op (its Triton compiles and autotuning shared by both modes).
  for op in ${REF_OPS:-gla simple_gla gsa mlstm_exp mlstm_sig}; do
    PYTHONUNBUFFERED=1 timeout ${REF_TIMEOUT:-120} python3 scripts/bench_reference.py --ops $op \
      --modes ${REF_MODES:-fwd,fwdbwd} --seq-lens ${REF_SEQ_LENS:-1024,4096,16384} 2>>"$OUT/bench_ref.err" |
      tee -a "$OUT/bench_ref.log"
    [ "${PIPESTATUS[0]}" = 124 ] && echo "ref $op TIMEOUT after ${REF_TIMEOUT:-120} s" | tee -a "$OUT/bench_ref.log"
  done
  grep -m3 -B1 -A3 "Error" "$OUT/bench_ref.err" | head -30
fi

if has bench || has ref; then
  status table
  python3 - "$OUT" <<'EOF'
import sys, re, os
out = sys.argv[1]
def read(name):
    p = os.path.join(out, name)
    return open(p).read().splitlines() if os.path.exists(p) else []
ours, ref = {}, {}
for line in read("bench_lair.log"):
    m = re.match(r"lair (\S+) T=(\d+) (fwd|fwdbwd) (.*)", line)
    if m: ours[m.groups()[:3]] = m.group(4)
for line in read("bench_ref.log"):
    m = re.match(r"ref (\S+) T=(\d+) (fwd|fwdbwd) (.*)", line)
    if m: ref[m.groups()[:3]] = m.group(4)
print(f"{'op':<12}{'T':>6} {'mode':<7}{'lair ms':>10}{'ref ms':>10}{'ref/lair':>9}")
for key in sorted(set(ours) | set(ref), key=lambda k: (k[0], int(k[1]), k[2])):
    a, b = ours.get(key, "-"), ref.get(key, "-")
    try: ratio = f"{float(b) / float(a):.2f}"
    except ValueError: ratio = ""
    print(f"{key[0]:<12}{key[1]:>6} {key[2]:<7}{a[:10]:>10}{b[:10]:>10}{ratio:>9}")
for line in read("bench_lair.log"):
    if line.startswith("lair step_") or line.startswith("lair copy"): print(line)
EOF
fi

if has model && [ -x $LAIR ]; then
  for preset in ${MODEL_PRESETS:-gla-1.3b gsa-1.3b xlstm-7b}; do
    status bench model $preset
    MODEL_DIR=$(mktemp -d)
    start=$(date +%s)
    timeout ${INIT_TIMEOUT:-300} $LAIR init --preset $preset --dtype bf16 --out "$MODEL_DIR" >>"$OUT/bench_model.log" 2>&1
    echo "init $preset: $(( $(date +%s) - start )) s, $(du -sh "$MODEL_DIR" | cut -f1) on disk" | tee -a "$OUT/bench_model.log"
    IFS=';' read -ra runs <<<"${MODEL_RUNS:-decode --batch 1 --prompt-len 512 --gen-len 128;decode --batch 32 --prompt-len 512 --gen-len 128;decode --batch 256 --prompt-len 64 --gen-len 32;prefill --batch 1 --prompt-len 4096}"
    for args in "${runs[@]}"; do
      timeout ${MODEL_TIMEOUT:-180} $LAIR bench $args --model "$MODEL_DIR" --device cuda --dtype bf16 \
        ${BENCH_ARGS:-} >>"$OUT/bench_model.log" 2>&1
      echo "exit $?: $(grep '^lair bench' "$OUT/bench_model.log" | tail -1)"
    done
    rm -rf "$MODEL_DIR"
  done
fi

if has profile && [ -x $LAIR ]; then
  # Where a decode step's time goes: three op-by-op steps of PROFILE_PRESET at
  # each of PROFILE_BATCHES under Nsight Compute (kernel durations only), the last step
  # summed per kernel name (scripts/ncu_step_table.py).
  status profile
  MODEL_DIR=$(mktemp -d)
  $LAIR init --preset ${PROFILE_PRESET:-gla-1.3b} --dtype bf16 --out "$MODEL_DIR" >/dev/null 2>&1
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for batch in ${PROFILE_BATCHES:-1 32}; do
    timeout ${PROFILE_TIMEOUT:-150} "$NCU" --clock-control none --cache-control ${PROFILE_CACHE:-all} \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
      --print-units base $LAIR bench decode --model "$MODEL_DIR" --device cuda --dtype bf16 \
      --batch $batch --prompt-len 16 --gen-len 2 --warmup 1 --no-graphs \
      >"$OUT/profile_b$batch.csv" 2>"$OUT/profile.err"
    echo "batch $batch: ncu exit $?"
    python3 scripts/ncu_step_table.py "$OUT/profile_b$batch.csv" --steps 3 \
      ${PROFILE_LIST:+--list}
  done
  if [ -n "${PROFILE_KERNEL:-}" ]; then  # why a kernel is slow: its sections, decode launches only
    for batch in ${PROFILE_BATCHES:-1 32}; do
      report="$OUT/profile_kernel_b$batch.txt"
      timeout ${PROFILE_TIMEOUT:-150} "$NCU" --clock-control none -k "regex:$PROFILE_KERNEL" \
        --launch-count "${PROFILE_KERNEL_COUNT:-6}" --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        $LAIR bench decode --model "$MODEL_DIR" --device cuda --dtype bf16 --batch "$batch" \
        --prompt-len 16 --gen-len 2 --warmup 0 --no-graphs >"$report" 2>>"$OUT/profile.err"
      echo "batch $batch, kernels matching $PROFILE_KERNEL: ncu exit $? (report in $(basename "$report"))"
      grep -E "^  [A-Za-z].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Grid Size|Registers Per|Dynamic Shared" \
        "$report" | head -80
    done
  fi
  if [ -n "${PROFILE_PREFILL:-}" ]; then  # a prefill of PROFILE_PREFILL tokens, every kernel
    timeout ${PROFILE_TIMEOUT:-150} "$NCU" --clock-control none --cache-control ${PROFILE_CACHE:-all} \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
      --print-units base $LAIR bench prefill --model "$MODEL_DIR" --device cuda --dtype bf16 \
      --batch 1 --prompt-len $PROFILE_PREFILL >"$OUT/profile_prefill.csv" 2>>"$OUT/profile.err"
    echo "prefill $PROFILE_PREFILL: ncu exit $?"
    python3 scripts/ncu_step_table.py "$OUT/profile_prefill.csv" --all
  fi
  rm -rf "$MODEL_DIR"
fi

if has hf; then
  status hf baseline
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site
  PYTHONUNBUFFERED=1 timeout ${HF_TIMEOUT:-240} python3 scripts/bench_hf_baseline.py ${HF_ARGS:-} 2>"$OUT/bench_hf.err" |
    tee "$OUT/bench_hf.log"
  [ "${PIPESTATUS[0]}" = 124 ] && echo "hf TIMEOUT after ${HF_TIMEOUT:-240} s (compiling and autotuning included)"
  grep -m3 -B1 -A3 "Error" "$OUT/bench_hf.err" | head -20
fi
status done
