#!/bin/sh
# runtime-packages.sh BINARY... : the Debian packages that hold the shared
# libraries the binaries load (ldd), one a line, sorted. The Dockerfile's
# build stage runs it on tierkvd and tierkv and the runtime stage installs
# exactly these, so the image carries no -dev package and no hand-kept list.
# Fails if a library is not found or belongs to no package.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
libs=""
for bin in "$@"; do
  out=$(ldd "$bin") || { echo "runtime-packages: ldd $bin failed" >&2; exit 1; }
  if printf '%s\n' "$out" | grep -q 'not found'; then
    printf '%s\n' "$out" | grep 'not found' >&2
    exit 1
  fi
  libs="$libs $(printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')"
done
pkgs=""
for lib in $libs; do
  real=$(readlink -f "$lib")
  pkg=""
  # Merged /usr: dpkg knows a file by the path its package shipped, which
  # may be the /usr or the / spelling, of the link or of its target.
  for p in "$lib" "/usr$lib" "$real" "${real#/usr}"; do
    pkg=$(dpkg-query -S "$p" 2>/dev/null | head -n1 | cut -d: -f1) || true
    [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  fi
  pkgs="$pkgs $pkg"
done
printf '%s\n' $pkgs | sort -u
