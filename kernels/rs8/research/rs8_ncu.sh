#!/usr/bin/env bash
# Nsight Compute view of one rs8 call (6 rows of CTX keys, k = 512) on the GPU
# machine: scheduler/warp-state summaries, then stall samples per SASS
# instruction (CSV), so time inside the kernel can be placed per instruction.
#   kernels/rs8/research/rs8_ncu.sh LIB OUTDIR [CTX]
set -uo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 LIB OUTDIR [CTX]" >&2; exit 2; }
command -v ncu >/dev/null || { echo "$0: needs Nsight Compute (ncu) and a CUDA GPU" >&2; exit 2; }
lib="$(realpath "$1")"; out="$2"; ctx="${3:-112464}"
py="$(cd "$(dirname "${BASH_SOURCE[0]}")/../python" && pwd)"  # rs8_op
mkdir -p "$out"
cat >/tmp/rs8_one.py <<PY
import sys, torch
sys.path.insert(0, "$py")
import rs8_op
lib = rs8_op.open_library("$lib")
x = torch.randn(6, $ctx, device="cuda")
seq = torch.full((6, 1), $ctx, dtype=torch.int32, device="cuda")
out = torch.empty((6, 512), dtype=torch.int32, device="cuda")
for _ in range(4):
    rs8_op.launch(x, 1, seq, out, 6, $ctx, 1, 512, lib=lib)
torch.cuda.synchronize()
PY
common=(--clock-control none -k regex:topk_decode -s 3 -c 1)
timeout 150 ncu "${common[@]}" --section SpeedOfLight --section SchedulerStats \
  --section WarpStateStats --section InstructionStats --section LaunchStats \
  --section MemoryWorkloadAnalysis \
  python3 /tmp/rs8_one.py >"$out/ncu_summary.txt" 2>&1
timeout 150 ncu "${common[@]}" --section SourceCounters --warp-sampling-interval 0 --page source --print-source sass \
  --csv python3 /tmp/rs8_one.py >"$out/ncu_sass.csv" 2>&1
grep -E "Duration|Elapsed Cycles|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Executed Instructions " "$out/ncu_summary.txt" | head -20
wc -l "$out/ncu_sass.csv"
