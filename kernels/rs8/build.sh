#!/usr/bin/env bash
# Build librs8.so (C ABI, see rs8_topk.cu) from the one source for a list of
# SM architectures, then prove the result holds machine code for each of them.
#
#   kernels/rs8/build.sh [OUT_DIR] [ARCHS]      ARCHS default: "120 90a"
#                                               ("sm_120 sm_90a" or "12.0 9.0a" also work)
#   RS8_EXTRA_FLAGS=-DRS8_BREAK kernels/rs8/build.sh /tmp/broken   # wrong build for tests
#   RS8_SRC=/path/old_rs8_topk.cu kernels/rs8/build.sh /tmp/old 90a  # another source, same flags
#
# Needs nvcc (>= 12.8 for sm_120) and cuobjdump (PATH, or CUOBJDUMP=/path; pip
# package nvidia-cuda-cuobjdump has one); no GPU.
set -euo pipefail
if [[ "${1:-}" == "--check" ]]; then
  # kernels/rs8/build.sh --check LIB "ARCHS": only the machine-code check.
  lib="$2"; archs=""
  for a in ${3:-120 90a}; do a="${a#sm_}"; a="${a#compute_}"; archs+="${a//./} "; done
  elfs="$("${CUOBJDUMP:-cuobjdump}" --list-elf "$lib")"
  for a in $archs; do
    grep -q "sm_${a}\b" <<<"$elfs" || { echo "rs8 check: no sm_${a} code in $lib" >&2; exit 1; }
  done
  echo "rs8 check: $lib holds sm code for: $archs"
  exit 0
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/build}"
archs=""
for a in ${2:-120 90a}; do  # normalise sm_120 / compute_120 / 12.0 to 120
  a="${a#sm_}"; a="${a#compute_}"; a="${a//./}"
  archs+="$a "
done
nvcc="${NVCC:-nvcc}"
cuobjdump="${CUOBJDUMP:-cuobjdump}"
mkdir -p "$out"

gencode=()
for a in $archs; do
  gencode+=("-gencode=arch=compute_${a},code=sm_${a}")
done

# Compile, then link: -objtemp names nvcc's intermediate files after the object (in
# $out) instead of /tmp/tmpxft_<pid>_..., a name that ends up in the library. With a
# build path and toolchain path that do not vary (frank.kernelbuild builds under a
# fixed path), two builds then give byte-identical libraries.
# shellcheck disable=SC2086
"$nvcc" -O3 -std=c++17 -Xcompiler -fPIC "${gencode[@]}" ${RS8_EXTRA_FLAGS:-} \
  -c -objtemp -o "$out/rs8_topk.o" "${RS8_SRC:-$here/rs8_topk.cu}"
"$nvcc" -shared -cudart static "${gencode[@]}" -o "$out/librs8.so" "$out/rs8_topk.o"

# The check: every requested arch must appear as an ELF (SASS) image.
elfs="$("$cuobjdump" --list-elf "$out/librs8.so")"
echo "$elfs"
for a in $archs; do
  if ! grep -q "sm_${a}\b" <<<"$elfs"; then
    echo "rs8 build: no sm_${a} machine code in $out/librs8.so" >&2
    exit 1
  fi
done
echo "rs8 build: $out/librs8.so holds sm code for: $archs"
