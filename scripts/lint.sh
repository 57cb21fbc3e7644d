#!/usr/bin/env bash
# Style checks, failing on any finding:
#  - clang-format (.clang-format) over every tracked C++ and CUDA file;
#  - clang-tidy (.clang-tidy) over the host C++ translation units of build/,
#    which scripts/test.sh configures and builds first (the server's
#    generated protobuf headers must exist). CUDA files are left to nvcc.
# Usage: scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."

git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror
echo "clang-format: clean"

if [ ! -f build/compile_commands.json ]; then
  echo "lint: build/compile_commands.json is missing; run scripts/test.sh first" >&2
  exit 1
fi
# run-clang-tidy (14) has no -warnings-as-errors: any diagnostic in the log
# fails the check (suppressed ones from system headers are only counted).
log=/tmp/lair-clang-tidy.log
status=0
# Boost 1.74's Asio enables co_await under clang only with libc++'s
# <experimental/coroutine>; against libstdc++ it is told that <coroutine> has
# it, or clang-tidy could not parse the HTTP front end.
run-clang-tidy -p build -j "$(nproc)" -quiet \
  -extra-arg=-DBOOST_ASIO_HAS_CO_AWAIT=1 -extra-arg=-DBOOST_ASIO_HAS_STD_COROUTINE=1 \
  "^$PWD/(checkpoint|cli|core|engine|kernels|models|server|tokenizer|tests)/.*\\.cc\$" \
  >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ] || grep -qE "(warning|error): " "$log"; then
  grep -E "(warning|error): " -A3 "$log" | head -60 >&2 || true  # head may cut the pipe
  echo "clang-tidy: findings above (full log: $log)" >&2
  exit 1
fi
echo "clang-tidy: clean"
