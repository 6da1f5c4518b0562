"""The Python half of ci/build-images: JSON fields, and the pushed image's --print smoke check.

Run with the Python that has frank installed (``$FRANK_PYTHON``). Every failure is one line
on stderr naming the file or image, and exit status 1; never a traceback.

    build_images_helper.py get FILE KEY[.KEY...]        print one field of a JSON file
    build_images_helper.py smoke REF LOCKFILE OUTDIR    pull REF (HOST/REPO@sha256:...) back from
                                                        the registry, run its entrypoint with
                                                        --print, check the lock digest it prints
    build_images_helper.py smoke-layout LAYOUT LOCKFILE OUTDIR
                                                        the same on a local OCI layout (no push)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PROG = "ci/build-images"


class CIError(Exception):
    """A failure to report as one line."""


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CIError(f"{path}: not found") from None
    except ValueError as exc:
        raise CIError(f"{path}: not valid JSON ({exc})") from None


def get(path: Path, key: str) -> str:
    """One field of a JSON file (dotted path); null prints as an empty string."""
    value: Any = _load(path)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise CIError(f"{path}: no field {key!r}")
        value = value[part]
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def lock_digest(lock_file: Path) -> str:
    """The ``digest`` a lock file records."""
    digest = get(lock_file, "digest")
    if not digest.startswith("sha256:"):
        raise CIError(f"{lock_file}: 'digest' is not a sha256 digest: {digest!r}")
    return digest


def print_check(layout: Path, lock_file: Path, out_dir: Path, what: str) -> str:
    """Run the image's entrypoint with --print; its lock digest must be the lock file's."""
    from frank.assemble.engines import run_image

    want = lock_digest(lock_file)
    proc = run_image(layout, ["--print"], check=False, timeout=300)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "print.stdout").write_text(proc.stdout, encoding="utf-8")
    (out_dir / "print.stderr").write_text(proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CIError(f"{what}: entrypoint --print exited {proc.returncode}: {tail}")
    try:
        shown = json.loads(proc.stdout)
    except ValueError:
        raise CIError(f"{what}: entrypoint --print did not print JSON "
                      f"(see {out_dir / 'print.stdout'})") from None
    got = shown.get("lock_digest") if isinstance(shown, dict) else None
    if got != want:
        raise CIError(f"{what}: entrypoint --print shows lock {got}, {lock_file} has {want}")
    if not isinstance(shown.get("command"), list) or not shown["command"]:
        raise CIError(f"{what}: entrypoint --print shows no engine command")
    (out_dir / "print.json").write_text(json.dumps(shown, indent=2, sort_keys=True) + "\n",
                                        encoding="utf-8")
    return f"--print ok: lock {got}, engine {' '.join(shown['command'][:4])} ..."


def smoke(ref: str, lock_file: Path, out_dir: Path) -> str:
    """Pull ``ref`` back from the registry by digest, then run the --print check on it."""
    from frank.image.remote import pull_layout

    repo, sep, digest = ref.rpartition("@")
    if not sep or not digest.startswith("sha256:"):
        raise CIError(f"not a reference by digest: {ref!r}")
    pulled = out_dir / "pulled"
    got = pull_layout(repo, digest, pulled)
    if got != digest:
        raise CIError(f"{ref}: registry gave back {got}")
    return print_check(pulled, lock_file, out_dir, ref)


def main(argv: list[str]) -> int:
    """Dispatch; every error becomes one line and exit status 1."""
    from frank.errors import FrankError

    try:
        match argv:
            case ["get", path, key]:
                print(get(Path(path), key))
            case ["smoke", ref, lock_file, out_dir]:
                print(smoke(ref, Path(lock_file), Path(out_dir)))
            case ["smoke-layout", layout, lock_file, out_dir]:
                print(print_check(Path(layout), Path(lock_file), Path(out_dir), layout))
            case _:
                raise CIError(f"usage: {Path(__file__).name} get|smoke|smoke-layout ...")
    except (CIError, FrankError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{PROG}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
