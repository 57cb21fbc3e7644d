#!/usr/bin/env bash
# Fuzzes the safetensors header parser with libFuzzer under ASan and UBSan.
# Usage: scripts/fuzz-safetensors.sh [seconds]   (default 60)
# Builds in build-fuzz/ with clang (needs clang and libclang-rt-14-dev; see
# scripts/install-deps.sh). Exits non-zero when the fuzzer finds a crash, a leak,
# undefined behaviour or an accepted header that breaks an invariant; the input
# that did it is left in build-fuzz/fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
build=build-fuzz
work="$build/fuzz"
export CCACHE_BASEDIR="$PWD"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DLAIR_FUZZ=ON -DLAIR_WITH_SERVER=OFF -DLAIR_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target safetensors_header_fuzzer

# Seeds and dictionary are generated, not committed: small valid files and a few
# near misses, so the fuzzer starts from the format rather than from nothing.
rm -rf "$work/seeds" "$work/artifacts"
mkdir -p "$work/seeds" "$work/corpus" "$work/artifacts"
python3 - "$work/seeds" "$work/safetensors.dict" <<'PY'
import json, os, struct, sys

seeds, dict_path = sys.argv[1], sys.argv[2]
SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "I64": 8}

def file_bytes(header, data_size, pad=True, header_len=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + bytes(data_size)

def packed(tensors, metadata=None):
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZE[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return header, offset

def write(name, data):
    with open(os.path.join(seeds, name), "wb") as f:
        f.write(data)

h, n = packed([("lm_head.weight", "F32", [4, 2]), ("norm.weight", "BF16", [2]),
               ("ids", "I64", [3]), ("empty", "F16", [0, 4]), ("scalar", "I32", [])],
              {"format": "pt"})
write("valid", file_bytes(h, n))
write("valid_unpadded", file_bytes(h, n, pad=False))
write("truncated_data", file_bytes(h, n)[:-5])
write("header_past_end", file_bytes(h, n, header_len=1 << 20))
write("empty_header", file_bytes({}, 0))
layers = []
for i in range(2):
    for part in ("q_proj", "k_proj", "v_proj", "o_proj", "gk_proj.0", "g_norm_swish_gate"):
        layers.append((f"model.layers.{i}.attn.{part}.weight", "BF16", [2, 2]))
h2, n2 = packed(layers)
write("layers", file_bytes(h2, n2))
bad = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
write("overlap", file_bytes(bad, 12))
write("not_json", struct.pack("<Q", 6) + b'{"a": ' )

tokens = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"', '"BF16"', '"F16"',
          '"I32"', '"I64"', '"F64"', "{", "}", "[", "]", ":", ",", "null", "true", "-1", "0",
          "18446744073709551615", "9223372036854775807", "1e308", '"\\u0000"']
with open(dict_path, "w") as f:
    for i, t in enumerate(tokens):
        f.write("t%d=%s\n" % (i, json.dumps(t)))
PY

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "Fuzzing ParseSafetensorsHeader for ${seconds}s (corpus: $work/corpus)"
"$build/bin/safetensors_header_fuzzer" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -dict="$work/safetensors.dict" -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
  "$work/corpus" "$work/seeds"
