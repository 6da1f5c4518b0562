"""Take librs8.so out of an OCI image layout that frank built, verified, for the GPU bench.

Why: the benchmark must measure the exact file the image ships (built on the host by the
pinned nvcc of the kernel part's lock entry), not a separate build. Every blob on the way
(index -> manifest -> layer) is checked against its digest before a byte is used.

    python3 bench/rs8_from_image.py out/candidate/image --out .device/rs8img
    # prints JSON: image digest, layer digest, member path, sha256 of librs8.so
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

NAME = "librs8.so"


def blob(layout: Path, digest: str) -> Path:
    """The blob file for digest, after checking its sha256."""
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64:
        raise SystemExit(f"rs8_from_image: unsupported digest {digest}")
    path = layout / "blobs" / "sha256" / hexd
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != hexd:
        raise SystemExit(f"rs8_from_image: blob {digest} does not match its digest")
    return path


def extract(layout: Path, out: Path) -> dict[str, Any]:
    """Write librs8.so from the topmost layer holding it into out; return what was taken."""
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"]
    manifest = json.loads(blob(layout, manifest_digest).read_text())
    for layer in reversed(manifest["layers"]):
        with tarfile.open(blob(layout, layer["digest"])) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.rsplit("/", 1)[-1] == NAME:
                    data = tar.extractfile(member)
                    assert data is not None
                    content = data.read()
                    out.mkdir(parents=True, exist_ok=True)
                    (out / NAME).write_bytes(content)
                    return {
                        "image": manifest_digest,
                        "layer": layer["digest"],
                        "member": "/" + member.name.lstrip("./"),
                        "sha256": hashlib.sha256(content).hexdigest(),
                        "size": len(content),
                    }
    raise SystemExit(f"rs8_from_image: no {NAME} in any layer of {layout}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layout", type=Path, help="OCI image layout (e.g. out/candidate/image)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write librs8.so into")
    args = parser.parse_args()
    info = extract(args.layout, args.out)
    (args.out / "origin.json").write_text(json.dumps(info, indent=2) + "\n")
    json.dump(info, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
