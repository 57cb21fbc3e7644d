#!/usr/bin/env bash
# Installs the Debian 12 packages LAIR builds against (idempotent).
# Usage: scripts/install-deps.sh [--python]   (--python adds the test clients)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev                  # Status/StatusOr, strings, Mutex
  nlohmann-json3-dev           # config.json, tokenizer.json, HTTP bodies
  libcli11-dev                 # the `lair` command line
  libspdlog-dev                # server logs
  libopenblas-dev              # CPU backend matrix products
  libpcre2-dev                 # tokenizer pre-tokenizer regexes (Unicode classes, lookahead)
  libicu-dev libutf8proc-dev   # Unicode normalization
  libgtest-dev libgmock-dev    # unit tests
  libbenchmark-dev             # micro-benchmarks
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # gRPC front end
  libboost-dev libboost-system-dev  # Beast/Asio HTTP front end
  clang libclang-rt-14-dev     # libFuzzer and sanitizer runtimes
  clang-format clang-tidy      # scripts/lint.sh
  python3 python3-pip
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${1:-}" = "--python" ]; then
  python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/requirements.txt"
fi
