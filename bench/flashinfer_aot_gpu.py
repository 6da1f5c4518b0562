"""Issue 52 item 3: FlashInfer modules frank built on a GPU-less host, run on a GPU.

Two steps, two machines:

``prepare`` (here, with frank): builds ``norm`` and ``silu_and_mul`` for "9.0a 12.0f" with
frank's builder (``frank.assemble.aot``, the served part's pinned wheels and toolchain,
builders/flashinfer-aot/gpu-proof.toml) and writes a kit folder: the two ``.so`` files (the
bytes frank's layer holds, by sha256), the flashinfer-python wheel the part builds from
(checked by sha256) and the pure-Python/cp312 wheels FlashInfer imports, and
``kit.json`` naming each file with its sha256.

    python bench/flashinfer_aot_gpu.py prepare --wheels DIR --kit .device/flashinfer-aot

``run`` (on the GPU machine: Python 3.12, torch with CUDA preinstalled, no network; only
the standard library and torch are used): checks every kit file's sha256, installs the
wheels with ``pip install --no-index --no-deps --target``, puts the modules at
``flashinfer/data/aot/<name>/<name>.so``, removes every folder holding ``nvcc`` from
PATH (and CUDA_HOME/CUDA_PATH), sets ``FLASHINFER_DISABLE_JIT=1`` (a missing module is an
error, not a compile) and ``FLASHINFER_USE_CUDA_NORM=1`` (rmsnorm through the CUDA ``norm``
module, not CuTe-DSL), and in a fresh interpreter checks that FlashInfer reports both
modules as AOT, that its JIT folder is still empty afterwards (nothing compiled), and
compares rmsnorm, fused_add_rmsnorm and silu_and_mul (bf16 and fp16) with torch
references. It prints a table and writes it (and JSON) to ``--results``.

    python3 bench/flashinfer_aot_gpu.py run --kit .device/flashinfer-aot --results $OUT/r.md
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

MODULES = ("norm", "silu_and_mul")
ARCHS = ["9.0a", "12.0f"]
# (op, dtype) -> (atol, rtol): bf16 has 8 bits of mantissa, fp16 11
TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- prepare (here, with frank) --------------------------------------------------------------

def prepare(args: argparse.Namespace) -> None:
    import tomllib

    from frank.assemble.aot import build_modules
    from frank.model.kinds import PART_ADAPTER

    root = Path(__file__).resolve().parents[1]
    manifest = root / "parts/flashinfer-aot/1.toml"
    raw = tomllib.loads(manifest.read_text())
    # other modules and archs than served's: its output_sha256 is not this build's
    raw.update(modules="builders/flashinfer-aot/gpu-proof.toml", archs=ARCHS)
    raw.pop("output_sha256", None)
    part = PART_ADAPTER.validate_python(raw)
    start = time.monotonic()
    built = build_modules(part, root, manifest)  # type: ignore[arg-type]
    took = time.monotonic() - start
    kit: Path = args.kit
    if kit.exists():
        shutil.rmtree(kit)
    (kit / "modules").mkdir(parents=True)
    (kit / "wheels").mkdir()
    files: dict[str, str] = {}
    for name in MODULES:
        dest = kit / "modules" / f"{name}.so"
        shutil.copyfile(built[name], dest)
        files[f"modules/{name}.so"] = sha256(dest)
    pinned = raw["wheel"]["sha256"]
    found = False
    for wheel in sorted(args.wheels.glob("*.whl")):
        digest = sha256(wheel)
        if wheel.name.startswith("flashinfer_python-"):
            if digest != pinned:
                sys.exit(f"{wheel}: sha256 {digest}, but the part builds from {pinned}")
            found = True
        shutil.copyfile(wheel, kit / "wheels" / wheel.name)
        files[f"wheels/{wheel.name}"] = digest
    if not found:
        sys.exit(f"{args.wheels}: no flashinfer_python wheel")
    doc = {"archs": ARCHS, "modules": list(MODULES), "files": files,
           "built_from": {"part": "parts/flashinfer-aot/1.toml",
                          "modules": "builders/flashinfer-aot/gpu-proof.toml",
                          "keys": {n: built[n].parent.name for n in MODULES}},
           "build_seconds": round(took, 1)}
    (kit / "kit.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    print(f"kit {kit}: {len(files)} files, {size / 2**20:.1f} MiB; modules built or kept "
          f"in {took:.1f} s")


# -- run (on the GPU machine) -----------------------------------------------------------------

def without_nvcc(env: dict[str, str]) -> dict[str, str]:
    """``env`` with every PATH folder that holds nvcc removed, and no CUDA_HOME/CUDA_PATH."""
    out = {k: v for k, v in env.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX")}
    folders = [p for p in env.get("PATH", "").split(os.pathsep)
               if p and not os.access(os.path.join(p, "nvcc"), os.X_OK)]
    out["PATH"] = os.pathsep.join(folders)
    return out


def run(args: argparse.Namespace) -> None:
    kit: Path = args.kit
    doc = json.loads((kit / "kit.json").read_text())
    for rel, digest in doc["files"].items():
        if sha256(kit / rel) != digest:
            sys.exit(f"{kit / rel}: sha256 differs from kit.json")
    work = Path(tempfile.mkdtemp(prefix="fi-aot-"))
    site = work / "site"
    wheels = sorted(str(kit / r) for r in doc["files"] if r.startswith("wheels/"))
    if importlib.util.find_spec("pip") is not None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                        "--no-deps", "--target", str(site), *wheels], check=True)
    else:  # no pip there: a wheel's purelib/platlib files are the archive's own layout
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
    aot = site / "flashinfer" / "data" / "aot"
    for name in doc["modules"]:
        (aot / name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kit / "modules" / f"{name}.so", aot / name / f"{name}.so")
    env = without_nvcc(dict(os.environ))
    env.update(PYTHONPATH=str(site), FLASHINFER_DISABLE_JIT="1", FLASHINFER_USE_CUDA_NORM="1",
               FLASHINFER_WORKSPACE_BASE=str(work / "ws"))
    (work / "ws").mkdir()
    proc = subprocess.run([sys.executable, __file__, "check", "--json", str(work / "r.json")],
                          env=env, text=True, capture_output=True, check=False)
    sys.stderr.write(proc.stderr[-4000:])
    if not (work / "r.json").is_file():
        sys.exit(f"the check did not finish (exit {proc.returncode})")
    result = json.loads((work / "r.json").read_text())
    compiled = sorted(str(p.relative_to(work / "ws")) for p in (work / "ws").rglob("*.so"))
    result["compiled_in_jit_workspace"] = compiled
    result["kit"] = {"archs": doc["archs"], "files": doc["files"],
                     "built_from": doc["built_from"]}
    result["nvcc_on_path"] = shutil.which("nvcc", path=env["PATH"])
    ok = (result["all_aot"] and not compiled and result["nvcc_on_path"] is None
          and all(r["ok"] for r in result["ops"]))
    result["ok"] = ok
    text = report(result)
    print(text)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(text)
        args.results.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


def report(r: dict) -> str:  # type: ignore[type-arg]
    lines = [
        "# FlashInfer modules built by frank on a GPU-less host, run on a GPU",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- command: python3 bench/flashinfer_aot_gpu.py run --kit .device/flashinfer-aot",
        f"- device: {r['device']} (capability {r['capability']}), driver CUDA "
        f"{r['cuda']}, torch {r['torch']}, Python {r['python']}",
        f"- flashinfer {r['flashinfer']}, AOT folder {r['aot_dir']}",
        f"- nvcc on PATH: {r['nvcc_on_path']}; FLASHINFER_DISABLE_JIT=1",
        f"- modules reported as AOT: {r['aot']} -> {'yes' if r['all_aot'] else 'NO'}",
        f"- .so files compiled into the JIT workspace: {r['compiled_in_jit_workspace'] or 'none'}",
        "- module files (sha256): " + ", ".join(
            f"{k} {v[:16]}" for k, v in r["kit"]["files"].items() if k.startswith("modules/")),
        "",
        "| op | dtype | shape | max abs err | atol | rtol | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in r["ops"]:
        lines.append(f"| {op['op']} | {op['dtype']} | {op['shape']} | {op['max_abs_err']:.3g} "
                     f"| {op['atol']} | {op['rtol']} | {'yes' if op['ok'] else 'NO'} |")
    lines += ["", f"verdict: {'PASS' if r['ok'] else 'FAIL'}", ""]
    return "\n".join(lines)


def check(args: argparse.Namespace) -> None:
    """In the prepared environment: AOT reported, ops against torch references."""
    import flashinfer
    import torch
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.norm import gen_norm_module

    specs = {"norm": gen_norm_module(), "silu_and_mul": gen_act_and_mul_module("silu")}
    aot = {name: spec.is_aot for name, spec in specs.items()}
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ops = []
    for dtype in (torch.bfloat16, torch.float16):
        atol, rtol = TOLERANCE[str(dtype).split(".")[-1]]
        for rows, hidden in ((7, 4096), (128, 7168)):
            x = torch.randn(rows, hidden, device=dev, dtype=dtype)
            w = torch.randn(hidden, device=dev, dtype=dtype)
            eps = 1e-6

            got = flashinfer.norm.rmsnorm(x, w, eps)
            ops.append(compare("rmsnorm", got, ref_rms(x, w, eps), atol, rtol))
            res = torch.randn_like(x)
            want_res = (x.float() + res.float()).to(dtype)
            want = ref_rms(want_res, w, eps)
            xi, ri = x.clone(), res.clone()
            flashinfer.norm.fused_add_rmsnorm(xi, ri, w, eps)
            ops.append(compare("fused_add_rmsnorm", xi, want, atol, rtol))
            ops.append(compare("fused_add_rmsnorm residual", ri, want_res, atol, rtol))
            y = torch.randn(rows, 2 * hidden, device=dev, dtype=dtype)
            got = flashinfer.activation.silu_and_mul(y)
            a, b = y.float().chunk(2, dim=-1)
            ops.append(compare("silu_and_mul", got, (torch.nn.functional.silu(a) * b).to(dtype),
                               atol, rtol))
    torch.cuda.synchronize()
    cap = torch.cuda.get_device_capability()
    out = {"aot": aot, "all_aot": all(aot.values()), "ops": ops,
           "device": torch.cuda.get_device_name(), "capability": f"{cap[0]}.{cap[1]}",
           "cuda": torch.version.cuda, "torch": torch.__version__,
           "python": sys.version.split()[0], "flashinfer": flashinfer.__version__,
           "aot_dir": str(jit_env.FLASHINFER_AOT_DIR)}
    args.json.write_text(json.dumps(out))


def ref_rms(v, w, eps: float):  # type: ignore[no-untyped-def]
    """torch's rmsnorm in fp32, rounded to the input's dtype."""
    import torch

    f = v.float()
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(v.dtype)


def compare(op: str, got, want, atol: float, rtol: float) -> dict:  # type: ignore[no-untyped-def,type-arg]
    import torch

    err = (got.float() - want.float()).abs().max().item()
    ok = bool(torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol))
    return {"op": op, "dtype": str(got.dtype).split(".")[-1], "shape": list(got.shape),
            "max_abs_err": err, "atol": atol, "rtol": rtol, "ok": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--wheels", type=Path, required=True)
    p.add_argument("--kit", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--kit", type=Path, required=True)
    r.add_argument("--results", type=Path)
    c = sub.add_parser("check")
    c.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "check": check}[args.cmd](args)


if __name__ == "__main__":
    main()
