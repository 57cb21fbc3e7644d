#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has CUDA,
# CMake and PyTorch but no network and none of our Debian -dev packages:
#   .carry/debroot.tar.xz  the Debian packages the CUDA build links (without the
#                          server front ends), unpacked with dpkg -x
#   .carry/ops, .carry/models  the golden fixtures (git-ignored copies for the device only;
#                          the models without their gradient goldens)
#   .whl/                  the reference kernels' wheels for scripts/bench_reference.py
# Run here, from anywhere; both folders are git-ignored and travel with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES=${LAIR_FIXTURES:-../shared/fixtures}

packages=(
  libabsl-dev libabsl20220623 nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5
  libgtest-dev libgmock-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libicu-dev libicu72 icu-devtools pkgconf pkgconf-bin libpkgconf3
)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}" >/dev/null)
mkdir -p "$work/root" .carry
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
# Static archives are only needed for GoogleTest and absl; the rest would bloat the carry.
find "$work/root" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' ! -name 'libabsl*' -delete
rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man"
tar -C "$work/root" -cJf .carry/debroot.tar.xz .
rm -rf .carry/ops .carry/models
cp -r "$FIXTURES/ops" "$FIXTURES/models" .carry/
chmod -R u+w .carry
# The device checks models with --no-grads; the gradient goldens would push the carry past 64 MiB.
rm -f .carry/models/*/grads.safetensors

mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl fla-core==0.6.0 flash-linear-attention==0.6.0 mlstm_kernels==2.0.6
du -sh .carry .whl
