"""Build sm120_probe.cu into a torch extension under the output folder (run by the step).

TORCH_CUDA_ARCH_LIST comes from the step's archs, in torch's spelling, written by frank.
"""

import os
import sys

from torch.utils.cpp_extension import load

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
load(name="sm120_probe", sources=[os.path.join(os.path.dirname(__file__), "sm120_probe.cu")],
     build_directory=out, verbose=True)
print(f"built sm120_probe for {os.environ['TORCH_CUDA_ARCH_LIST']} in {out}")
