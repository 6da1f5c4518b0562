"""Build vLLM's decode top-k kernels from its released sources as op namespace ``rs8vb``.

Why: the benchmark must time vLLM's own kernels (``top_k_per_row_decode``,
``persistent_topk``, ``cooperative_topk``) beside rs8 without installing vLLM.
The sources come from the vLLM sdist (``pip download --no-deps --no-binary :all:
vllm==0.33.0``), extracted into a git-ignored folder and carried to the GPU
machine; they are never committed. Prints the path of the built library.

    python3 bench/build_vllm_topk.py --src .rs8_vllm_src/csrc --out /tmp/rs8vb
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

VLLM_SOURCES = ("sampler.cu", "topk.cu", "cooperative_topk.cu")
DEFINES = (
    "-DTORCH_TARGET_VERSION=0x020B000000000000ULL",  # as vLLM 0.33 builds _C_stable_libtorch
    "-DUSE_CUDA",
    "-DVLLM_ENABLE_COOPERATIVE_TOPK=1",
)


def build(src: Path, out: Path, arch: str) -> Path:
    """Compile the three vLLM sources plus our binding; return the shared library path."""
    from torch.utils import cpp_extension

    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    out.mkdir(parents=True, exist_ok=True)
    binding = Path(__file__).resolve().parent / "vllm_topk_binding.cpp"
    sources = [str(binding), *(str(src / name) for name in VLLM_SOURCES)]
    cpp_extension.load(
        name="rs8vb",
        sources=sources,
        extra_include_paths=[str(src)],
        extra_cflags=["-O3", "-std=c++17", *DEFINES],
        extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr", *DEFINES],
        build_directory=str(out),
        is_python_module=False,
        verbose=False,
    )
    return out / "rs8vb.so"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", type=Path, required=True, help="vLLM csrc folder (extracted)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arch", default="9.0a", help="TORCH_CUDA_ARCH_LIST value")
    args = parser.parse_args()
    print(build(args.src, args.out, args.arch))


if __name__ == "__main__":
    main()
