#!/usr/bin/env bash
# Prints, one a line, the Debian packages that hold the shared libraries
# BINARY loads, so the runtime image installs exactly what the build linked
# (no hand-kept list of -dev/runtime package pairs to drift out of date).
# Fails when a library belongs to no package. Libraries ldd cannot find (the
# CUDA driver, which the NVIDIA container runtime mounts) are skipped.
# Usage: deploy/runtime-packages.sh build/bin/lair > runtime-packages.txt
set -euo pipefail
binary=$1

ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
  real=$(readlink -f "$lib")
  found=""
  # dpkg records one spelling of a path; /lib and /usr/lib are the same on Debian 12.
  for path in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    if owner=$(dpkg -S "$path" 2>/dev/null); then
      found=${owner%%:*}
      break
    fi
  done
  if [ -z "$found" ]; then
    echo "runtime-packages.sh: no Debian package holds $lib" >&2
    exit 1
  fi
  echo "$found"
done | sort -u
