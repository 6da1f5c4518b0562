#!/usr/bin/env bash
# One device call (run from the repo root on the GPU machine; writes under $OUT):
# build rs8 for sm_90a + sm_120 and check the machine code, build the -DRS8_BREAK
# variant, build vLLM 0.33.0's top-k kernels (from the carried, git-ignored
# .rs8_vllm_src/csrc) unless a prebuilt .rs8_vllm_src/prebuilt/rs8vb.so is
# carried, then the GPU tests and the benchmark.  Each step has a time limit so a
# hung kernel cannot eat the whole call.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/rs8out}"
mkdir -p "$OUT"
STEPS="${STEPS:-smoke tests bench}"  # also: sanitize vtests stages blocks ncu
# (stages, blocks and ncu run the research tools in kernels/rs8/research/)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

vb=.rs8_vllm_src/prebuilt/rs8vb.so
if [[ ! -f "$vb" && -d .rs8_vllm_src/csrc ]]; then
  (time MAX_JOBS=16 python3 bench/build_vllm_topk.py --src .rs8_vllm_src/csrc --out /tmp/rs8vb \
     >"$OUT/vllm_build.log" 2>&1) 2>>"$OUT/vllm_build.log" &
  vb_pid=$!
  vb=/tmp/rs8vb/rs8vb.so
fi
# vLLM's ops for the plugin's GPU test (tests/test_rs8_gpu.py): the test steps wait
# for the build above (up to ~90 s) unless a prebuilt library was carried.
vllm_lib() {
  [[ -n "${vb_pid:-}" ]] && wait "$vb_pid"
  vb_pid=""
  [[ -f "$vb" ]] && export RS8_VLLM_LIB="$(realpath "$vb")"
  return 0
}
# Timing variants: VARIANTS="name:-DFLAG name2:-DFLAG2" builds each for sm_90a.
variant_args=()
pids=()
for v in ${VARIANTS:-}; do  # built side by side
  name="${v%%:*}"; flags="${v#*:}"
  src=""
  if [[ "$flags" == @* ]]; then src="${flags#@}"; flags=""; fi  # name:@path/to/older_source.cu
  # The same build script (and flags) as the kernel under test.
  RS8_SRC="$src" RS8_EXTRA_FLAGS="${flags//,/ }" kernels/rs8/build.sh "/tmp/rs8v_$name" 90a \
    >/dev/null 2>&1 &
  pids+=($!)
done
kernels/rs8/build.sh kernels/rs8/build "90a 120" 2>&1 | tee "$OUT/build.log"
RS8_EXTRA_FLAGS=-DRS8_BREAK kernels/rs8/build.sh /tmp/rs8break 90a >/dev/null 2>&1
# RS8_IMAGE_LIB: measure the librs8.so taken out of an image frank built (bench/rs8_from_image.py)
# instead of this machine's build; the build above still runs, for the machine-code check.
export RS8_LIB="${RS8_IMAGE_LIB:-$PWD/kernels/rs8/build/librs8.so}" RS8_BREAK_LIB=/tmp/rs8break/librs8.so
[[ -n "${RS8_IMAGE_LIB:-}" ]] && sha256sum "$RS8_IMAGE_LIB" kernels/rs8/build/librs8.so | tee "$OUT/libs.sha256"
[[ ${#pids[@]} -gt 0 ]] && wait "${pids[@]}"
for v in ${VARIANTS:-}; do
  name="${v%%:*}"
  [[ -f "/tmp/rs8v_$name/librs8.so" ]] && variant_args+=(--variant "$name=/tmp/rs8v_$name/librs8.so")
done

if [[ " $STEPS " == *" smoke "* ]]; then  # one row shape per cluster size, exact or not
  timeout 60 python3 bench/rs8_check.py 6x100 6x5000 6x150000 6x190000 2>&1 | tee "$OUT/smoke.log"
fi
if [[ " $STEPS " == *" sanitize "* ]]; then  # memcheck, racecheck, synccheck on small calls
  # 16-, 16-, 8- and 4-block clusters, each with one constant row (the general path)
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool" | tee -a "$OUT/sanitize.log"
    timeout 240 compute-sanitizer --tool "$tool" python3 bench/rs8_check.py 6x5000 6x150000 \
      12x150000 48x120000 --constant-row --label "sanitized run" 2>&1 | tail -7 |
      tee -a "$OUT/sanitize.log"
  done
fi
if [[ " $STEPS " == *" tests "* || " $STEPS " == *" vtests "* ]]; then vllm_lib; fi
if [[ " $STEPS " == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -x \
    tests/test_rs8_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
fi
if [[ " $STEPS " == *" vtests "* ]]; then  # the GPU tests against variant builds (VTEST_NAMES, or all)
  for va in "${variant_args[@]}"; do
    [[ "$va" == --variant ]] && continue
    [[ -n "${VTEST_NAMES:-}" && " $VTEST_NAMES " != *" ${va%%=*} "* ]] && continue
    echo "== GPU tests on variant ${va%%=*}" | tee -a "$OUT/gpu_tests.log"
    RS8_LIB="${va#*=}" timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu \
      -x tests/test_rs8_gpu.py 2>&1 | tail -2 | tee -a "$OUT/gpu_tests.log"
  done
fi
wait
tail -3 "$OUT/vllm_build.log" 2>/dev/null
if [[ -f "$vb" && ! -f .rs8_vllm_src/prebuilt/rs8vb.so ]]; then cp "$vb" "$OUT/rs8vb.so"; fi
if [[ " $STEPS " == *" stages "* ]]; then
  # The kernel under test, then STAGE_VARIANTS="name:-DFLAG,-DFLAG2 ..." (flag builds only).
  for sv in "main:" ${STAGE_VARIANTS:-}; do
    name="${sv%%:*}"; flags="${sv#*:}"
    RS8_EXTRA_FLAGS="-DRS8_TIMING ${flags//,/ }" kernels/rs8/build.sh "/tmp/rs8t_$name" 90a \
      >/dev/null 2>&1
    for c in 112464 191998; do
      echo "== stages: $name ${flags//,/ }"
      timeout 60 python3 kernels/rs8/research/rs8_stage_times.py --lib "/tmp/rs8t_$name/librs8.so" --ctx "$c"
    done
  done 2>&1 | tee "$OUT/stages.log"
fi
if [[ " $STEPS " == *" blocks "* ]]; then  # globaltimer stamps of every block and warp
  RS8_EXTRA_FLAGS=-DRS8_TSTAMP kernels/rs8/build.sh /tmp/rs8s 90a >/dev/null 2>&1
  timeout 180 python3 kernels/rs8/research/rs8_block_times.py --lib /tmp/rs8s/librs8.so --rows "${BLOCK_ROWS:-1,6}" \
    --ctx "${BLOCK_CTX:-112464,191998}" --json "$OUT/blocks.json" 2>&1 | tee "$OUT/blocks.log"
fi
if [[ " $STEPS " == *" ncu "* ]]; then  # Nsight Compute summary + stall samples per instruction
  bash kernels/rs8/research/rs8_ncu.sh "$RS8_LIB" "$OUT" 150000
fi
if [[ " $STEPS " == *" bench "* ]]; then
  timeout 400 python3 bench/rs8_bench.py --vllm-lib "$vb" --out "$OUT/bench.md" \
    --json "$OUT/bench.json" "${variant_args[@]}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
