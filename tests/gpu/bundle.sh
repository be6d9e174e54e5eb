#!/usr/bin/env bash
# bundle.sh — builds the GPU check as one folder that runs on a bare GPU
# machine (no Debian -dev packages, no package registry; it has the NVIDIA
# driver): the CUDA tests, tierkvd, the tierkv CLI and tierkv-bench, built
# here with nvcc (sm_80, sm_89, sm_90), stripped, with every shared library they need that is not
# glibc's or the driver's copied beside them, and the runner (run.sh).
#
#   tests/gpu/bundle.sh [BUILD_DIR] [BUNDLE_DIR]
#       BUILD_DIR  default build-gpu (configured -DTIERKV_CUDA=ON)
#       BUNDLE_DIR default gpu-bundle (git-ignored), at most 60 MiB
#
# Then, on the GPU machine, from the repository root (the device tool
# carries the folder: carry=["gpu-bundle"]):  gpu-bundle/run.sh --out $OUT
# Here, without a GPU:                         gpu-bundle/run.sh --no-gpu
# tests/gpu/README.md says more.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
bundle=${2:-gpu-bundle}
arch=${CUDA_ARCH:-80-real;89-real;90-real}  # cmake/Cuda.cmake's default
limit=$((60 << 20))
binaries=(gpu_tests tierkvd tierkv tierkv-bench)

start=$(date +%s)
scripts/build.sh "$build" -DTIERKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -- "${binaries[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for b in "${binaries[@]}"; do
  strip --strip-all -o "$bundle/bin/$b" "$build/bin/$b"
done

# Libraries the bundle must carry: everything the binaries load except
# glibc (the machine's own, which must be at least as new as Debian 12's
# 2.36) and the NVIDIA driver (libcuda; the CUDA runtime is linked in
# statically). Copied under their sonames, stripped.
is_system() {
  case $1 in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
      ld-linux*.so.* | libcuda.so.* | linux-vdso.so.*) return 0 ;;
  esac
  return 1
}
missing=0
for b in "${binaries[@]}"; do
  while read -r soname _ path _; do
    [[ $soname == *.so* ]] || continue
    soname=$(basename "$soname")
    is_system "$soname" && continue
    if [[ $path == "not" || -z $path ]]; then
      echo "bundle: $b needs $soname, which is not found here" >&2
      missing=1
      continue
    fi
    [[ -e $bundle/lib/$soname ]] || strip --strip-unneeded -o "$bundle/lib/$soname" "$path"
  done < <(ldd "$build/bin/$b")
done
((missing == 0)) || exit 1

cp tests/gpu/bundle-run.sh "$bundle/run.sh"
chmod +x "$bundle/run.sh"
{
  echo "tierkv GPU check bundle"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo '+changes')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?'), architectures $arch"
  (cd "$bundle" && find bin lib -type f -printf '%s %p\n' | sort -k2)
} > "$bundle/MANIFEST"

size=$(du -sb "$bundle" | cut -f1)
if ((size > limit)); then
  echo "bundle: $bundle is $((size >> 20)) MiB, over the $((limit >> 20)) MiB limit" >&2
  exit 1
fi
echo "bundle: $bundle: ${#binaries[@]} binaries, $(ls "$bundle/lib" | wc -l) libraries," \
  "$((size >> 20)) MiB, in $(($(date +%s) - start)) s"
