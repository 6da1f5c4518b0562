"""On a GPU: exllamav3 imports the ahead-of-time ``exllamav3_ext`` and compiles nothing.

Self-contained (standard library + the machine's torch), offline. From a folder holding the
exllamav3 1.6.5 wheel and an ``exllamav3_ext.cpython-<py>-x86_64-linux-gnu.so`` built by
bench/exllamav3_ext_build.py for this GPU's arch and this Python (the module is per CPython
``major.minor``: the served image's 3.11 one does not load on 3.12), it

1. unpacks the wheel (a zip; its dependencies are not needed to import ``exllamav3.ext``)
   into a temp folder and puts the module beside it on ``sys.path``;
2. hides every compiler: PATH is only the interpreter's folder, CUDA_HOME/CUDA_PATH unset,
   and ``torch.utils.cpp_extension.load`` replaced by a function that fails the run;
3. imports ``exllamav3.ext`` (without the package's ``__init__``, which would import its
   tokenizer and model stack) and checks ``exllamav3_ext`` came from the given file;
4. runs ``rms_norm`` on fp16 and bf16 and compares with a torch reference.

    python bench/exllamav3_ext_gpu.py .device/exl3

Prints one JSON line; exit 0 only if every check passed.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import types
import zipfile
from pathlib import Path


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".device/exl3").resolve()
    wheel = next(folder.glob("exllamav3-*.whl"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    module = folder / f"exllamav3_ext{suffix}"
    if not module.is_file():
        print(json.dumps({"ok": False, "why": f"no {module.name} for this Python in {folder}",
                          "found": sorted(p.name for p in folder.glob("exllamav3_ext*"))}))
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="exl3-gpu-"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp)
    shutil.copyfile(module, tmp / module.name)
    sys.path.insert(0, str(tmp))

    os.environ["PATH"] = str(Path(sys.executable).parent)
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDAHOSTCXX", "CC", "CXX"):
        os.environ.pop(var, None)
    found = {t: shutil.which(t) for t in ("nvcc", "g++", "gcc", "c++", "ninja")}

    import torch
    import torch.utils.cpp_extension as cpp

    compiled: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        compiled.append(str(kwargs.get("name") or (args[0] if args else "?")))
        raise RuntimeError("exllamav3 tried to compile its extension")

    cpp.load = refuse  # type: ignore[assignment]
    # the package without its __init__ (tokenizers, safetensors, the model stack)
    pkg = types.ModuleType("exllamav3")
    pkg.__path__ = [str(tmp / "exllamav3")]
    sys.modules["exllamav3"] = pkg
    t0 = time.monotonic()
    ext_py = importlib.import_module("exllamav3.ext")
    import_s = time.monotonic() - t0
    ext = ext_py.exllamav3_ext
    origin = Path(ext.__file__).resolve()

    results: dict[str, object] = {}
    ok = origin == (tmp / module.name).resolve() and not compiled
    dev = torch.device("cuda")
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
        torch.manual_seed(0)
        x = torch.randn(64, 4096, device=dev, dtype=dtype)
        w = torch.randn(4096, device=dev, dtype=dtype)
        y = torch.empty_like(x)
        ext.rms_norm(x, w, y, 1e-6, 0.0, 1.0, False, False)
        torch.cuda.synchronize()
        xf = x.float()
        ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
        err = ((y.float() - ref).abs() / (ref.abs() + 1.0)).max().item()
        results[str(dtype).removeprefix("torch.")] = round(err, 6)
        ok = ok and err < tol
    print(json.dumps({
        "ok": ok, "module": module.name, "origin": str(origin), "compiled": compiled,
        "tools_on_path": found, "import_s": round(import_s, 3),
        "rms_norm_max_rel_err": results, "gpu": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__, "python": sys.version.split()[0],
        "module_sha256": __import__("hashlib").sha256(module.read_bytes()).hexdigest(),
    }))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
