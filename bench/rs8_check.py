"""One rs8 call per shape on the GPU, compared byte for byte with the CPU reference.

Why: bench/run_h200.sh's smoke step and its compute-sanitizer step both need a
short, self-checking launch; this is the one script they share.

    python3 bench/rs8_check.py 6x100 6x150000 --constant-row --label sanitized
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels" / "rs8" / "python"))
import rs8_op
import rs8_ref


def check(rows: int, length: int, k: int, constant_row: bool) -> int:
    """Mismatched output slots of one call on random rows (row 1 constant if asked)."""
    x = torch.randn(rows, length, device="cuda")
    if constant_row and rows > 1:
        x[1] = 0.5  # every key ties: the general path
    seq = torch.full((rows, 1), length, dtype=torch.int32, device="cuda")
    out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    rs8_op.launch(x, 1, seq, out, rows, length, 1, k)
    torch.cuda.synchronize()
    ref = rs8_ref.topk_decode_ref(x.cpu(), 1, seq.cpu(), k)
    return int((out.cpu() != ref).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("shapes", nargs="+", help="ROWSxLENGTH, e.g. 6x150000")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--constant-row", action="store_true", help="make row 1 constant")
    parser.add_argument("--label", default="smoke")
    args = parser.parse_args()
    bad = 0
    for shape in args.shapes:
        rows, length = (int(v) for v in shape.split("x"))
        diff = check(rows, length, args.k, args.constant_row)
        bad += diff
        print(args.label, rows, length, "equal" if diff == 0 else f"DIFF {diff}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
