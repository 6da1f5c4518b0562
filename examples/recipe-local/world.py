"""The local world the recipe-local example needs, and the example rendered into a frank repo.

The published SM120 recipe reaches GitHub, Docker Hub and NVIDIA's and FlashInfer's
indexes; this one reaches only things made here, PyPI (pip, setuptools, setuptools-scm,
packaging: the engine image's own build tools, by sha256) and Debian's archive (the test
base's pinned .debs). ``make_world`` makes:

- an **official engine image** of our own: images/test-base's layers plus one layer of
  distributions installed from real wheels (the engine, recipe-kernels 1.0, recipe-cubin 1.0,
  recipe-common 1.0, recipe-legacy 1.0, and the PyPI build tools), the host's ``make`` and a header whose time
  is a real one (an official image's files carry theirs), an OCI layout pinned by digest;
- a **PEP 503 index** (recipe-ext 1.0+cu130, with a local version label; recipe-kernels 1.0
  and 2.0;
  recipe-jit 1.0; recipe-common 1.0 and 2.0; recipe-needy 1.0, which wants recipe-common>=2.0)
  and the engine patch, served on 127.0.0.1;
- and ``render`` writes the example's parts, stack and image file into a repo folder with
  those URLs and digests, and makes its git source (``sources/recipe-scm``: tagged v0.1.0,
  then one commit) there: a local git source must be inside the repo.

Run it to try the example by hand (it serves until Ctrl-C)::

    python examples/recipe-local/world.py /tmp/recipe-local
    cd /tmp/recipe-local && frank lock recipe-local && frank compose stacks/recipe-local.toml \
        --builder buildah && frank audit stacks/recipe-local.toml
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import string
import subprocess
import sys
import tarfile
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent
REPO = EXAMPLE.parents[1]
SITE = "usr/local/lib/python3.11/dist-packages"
ENGINE_COMMIT = "e" * 40  # the engine image's source commit (a name: nothing fetches it)
FRESH = 1750000000  # the image's file times: 2025-06-15, far past SOURCE_DATE_EPOCH
GREETING = "GREETING = 'hello'\n"
# the engine's file, and a new tool outside its package (issue 54 item 2: placed where the
# part's [destinations] says, or the build fails naming it)
TOOL = "print('recipe probe')\n"
PATCH = ("--- a/recipe_engine/serve.py\n+++ b/recipe_engine/serve.py\n"
         "@@ -1 +1 @@\n-GREETING = 'hello'\n+GREETING = 'patched'\n"
         "--- /dev/null\n+++ b/tools/recipe_probe.py\n@@ -0,0 +1 @@\n+" + TOOL)
EXT = "recipe_ext-1.0+cu130-py3-none-any.whl"
KERNELS_1 = {"__init__.py": "KERNELS = 1\n", "old_only.py": "OLD = 1\n"}
CUBIN_1 = {"__init__.py": "CUBIN = 1\n", "cubins/table.txt": "sm_120 probe\n"}
# The engine image's build tools, from PyPI by sha256 (what an official image has: the
# recipe's source build runs with the image's own setuptools, offline).
PYPI = "https://files.pythonhosted.org/packages/"
TOOLS = (
    (PYPI + "ef/7d/500c9ad20238fcfcb4cb9243eede163594d7020ce87bd9610c9e02771876/"
     "pip-24.3.1-py3-none-any.whl",
     "3790624780082365f47549d032f3770eeb2b1e8bd1f7b2e02dace1afa361b4ed"),
    (PYPI + "55/21/47d163f615df1d30c094f6c8bbb353619274edccf0327b185cc2493c2c33/"
     "setuptools-75.6.0-py3-none-any.whl",
     "ce74b49e8f7110f9bf04883b730f4765b774ef3ef28f722cce7c273d253aaf7d"),
    (PYPI + "a0/b9/1906bfeb30f2fc13bb39bf7ddb8749784c05faadbd18a21cf141ba37bff2/"
     "setuptools_scm-8.1.0-py3-none-any.whl",
     "897a3226a6fd4a6eb2f068745e49733261a21f70b1bb28fce0339feb978d9af3"),
    (PYPI + "88/ef/eb23f262cca3c0c4eb7ab1933c3b1f03d021f2c48f54763065b6f0e321be/"
     "packaging-24.2-py3-none-any.whl",
     "09abb1bccd265c01f4a3aa3f7a7db064b36514d2cba19a2f694fe6150451a759"),
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(folder: Path, name: str, version: str, files: dict[str, str],
          requires: tuple[str, ...] = ()) -> Path:
    """A valid pure-Python wheel (METADATA, WHEEL, RECORD), byte-reproducible."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    members = {f"{module}/{rel}": text.encode() for rel, text in files.items()}
    members[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    members[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: recipe-local\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = "".join(f"{path},sha256={_b64(data)},{len(data)}\n" for path, data in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for member, data in members.items():
            zf.writestr(zipfile.ZipInfo(member, (1980, 1, 1, 0, 0, 0)), data)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class World:
    """What ``make_world`` made: the base layout and digest, and the folder served."""

    base: Path
    digest: str
    served: Path


def _index(served: Path) -> None:
    """The second index's wheels and PEP 503 pages (``simple/<project>/``)."""
    files = served / "files"
    files.mkdir(parents=True)
    made = [wheel(files, "recipe-ext", "1.0+cu130", {"__init__.py": "EXT = 1\n"},
                  ("recipe-common>=1.0",)),
            wheel(files, "recipe-kernels", "1.0", KERNELS_1),  # the image's, as an index has
            wheel(files, "recipe-kernels", "2.0", {"__init__.py": "KERNELS = 2\n"},
                  ("recipe-jit==1.0",)),
            wheel(files, "recipe-jit", "1.0", {"__init__.py": "JIT = 1\n"}),
            wheel(files, "recipe-common", "1.0", {"__init__.py": "COMMON = 1\n"}),
            wheel(files, "recipe-common", "2.0", {"__init__.py": "COMMON = 2\n"}),
            # wants a newer recipe-common than the image's (issue 54 item 8: the conflict
            # names the image's version and the overrides line that changes it)
            wheel(files, "recipe-needy", "1.0", {"__init__.py": "NEEDY = 1\n"},
                  ("recipe-common>=2.0",))]
    for path in made:
        project = path.name.split("-")[0].replace("_", "-")
        page = served / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = page.read_text() if page.exists() else ""
        href = f"../../files/{urllib.parse.quote(path.name)}#sha256={_sha256(path)}"
        page.write_text(links + f'<a href="{href}">{path.name}</a>\n')
    (served / "engine-fix.patch").write_text(PATCH)


def _tar(tree: Path, mtime: int) -> bytes:
    """A layer tar of ``tree``: sorted, owners 0, one time."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(tree.rglob("*")):
            info = tar.gettarinfo(str(path), path.relative_to(tree).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _base(top: Path) -> tuple[Path, str]:
    """images/test-base's layers plus the engine layer: an OCI layout and its digest."""
    from frank.assemble.base import resolve_base
    from frank.assemble.install import install_wheels
    from frank.image.oci import canonical_json, layout_blob_path, layout_manifests, resolve_manifest
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher, Pinned

    store = BlobStore()
    base = resolve_base(REPO / "images/test-base.toml", store, quiet=True)
    _, _, manifest = resolve_manifest(base.layout, base.digest)
    config = json.loads(layout_blob_path(base.layout, manifest["config"]["digest"]).read_bytes())
    layers = [layout_blob_path(base.layout, d["digest"]).read_bytes()
              for d in manifest["layers"]]
    made = top / "engine-wheels"
    made.mkdir()
    wheels = [
        wheel(made, "recipe-engine", "1.0", {"__init__.py": "", "serve.py": GREETING}),
        wheel(made, "recipe-kernels", "1.0", KERNELS_1),
        # like flashinfer-cubin: a package folder with a data folder in it (issue 54 item 1:
        # a remove must take the folders too, or the package still imports)
        wheel(made, "recipe-cubin", "1.0", CUBIN_1),
        wheel(made, "recipe-common", "1.0", {"__init__.py": "COMMON = 1\n"}),
        # taken out by a step's removes (issue 54 item 5: diff and the audit count it)
        wheel(made, "recipe-legacy", "1.0", {"__init__.py": "LEGACY = 1\n"}),
    ]
    fetcher = Fetcher(store, [])
    tools = [(url.rsplit("/", 1)[1], fetcher.fetch(Pinned(url, sha))) for url, sha in TOOLS]
    tree = top / "engine-tree"
    install_wheels([*tools, *[(w.name, w) for w in wheels]], tree, "/" + SITE)
    make = shutil.which("make")
    if make is None:
        raise SystemExit("recipe-local: the engine image takes the host's make; none found")
    (tree / "usr/bin").mkdir(parents=True)
    shutil.copy(make, tree / "usr/bin/make")
    header = tree / "usr/include/recipe/recipe.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define RECIPE_VERSION 1\n")
    config["history"] = [*config.get("history", []),
                         {"created_by": "recipe-local: the engine and its distributions"}]
    config["rootfs"] = {"type": "layers", "diff_ids": []}
    layers.append(_tar(tree, FRESH))
    out = top / "base"
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    tar = "application/vnd.oci.image.layer.v1.tar"
    descs = [{"mediaType": tar, **put(x)} for x in layers]
    config["rootfs"]["diff_ids"] = [d["digest"] for d in descs]
    body = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       **put(canonical_json(config))}, "layers": descs}
    raw = canonical_json(body)
    mdesc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **put(raw)}
    (out / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(canonical_json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [mdesc]}))
    return out, layout_manifests(out)[0]["digest"]


def make_world(top: Path) -> World:
    """Make the base image and the served folder under ``top`` (a fresh folder)."""
    top.mkdir(parents=True, exist_ok=True)
    served = top / "served"
    _index(served)
    base, digest = _base(top)
    return World(base=base, digest=digest, served=served)


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on 127.0.0.1 (a free port): yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, directory=str(folder), **k)  # type: ignore[arg-type]

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def git(*args: str, cwd: Path) -> str:
    """git with a fixed identity and dates, so the source's commits are the same each time."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "recipe", "GIT_AUTHOR_EMAIL": "recipe@local",
           "GIT_COMMITTER_NAME": "recipe", "GIT_COMMITTER_EMAIL": "recipe@local",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _source(repo: Path) -> str:
    """sources/recipe-scm as a git repo: v0.1.0, then one commit; returns the pinned one."""
    src = repo / "sources" / "recipe-scm"
    shutil.copytree(EXAMPLE / "sources" / "recipe-scm", src)
    git("init", "-q", "-b", "main", cwd=src)
    git("add", ".", cwd=src)
    git("commit", "-qm", "recipe-scm 0.1.0", cwd=src)
    git("tag", "v0.1.0", cwd=src)
    (src / "recipe_scm" / "__init__.py").write_text("VALUE = 2\n")
    git("commit", "-qam", "after the tag", cwd=src)
    return git("rev-parse", "HEAD", cwd=src)


def render(repo: Path, world: World, url: str) -> dict[str, str]:
    """The example's parts, stacks and images written into ``repo`` (a new folder) with the
    world's URLs and digests, and its git source made; returns the values substituted."""
    repo.mkdir(parents=True)
    shutil.copytree(world.base, repo / "bases" / "recipe-engine-image")
    ext = world.served / "files" / EXT
    values = {
        "BASE_REF": f"oci:{repo}/bases/recipe-engine-image@{world.digest}",
        "ENGINE_COMMIT": ENGINE_COMMIT,
        "INDEX_URL": f"{url}/simple",
        "EXT_URL": f"{url}/files/{urllib.parse.quote(EXT)}",
        "EXT_SHA256": _sha256(ext),
        "PATCH_URL": f"{url}/engine-fix.patch",
        "PATCH_SHA256": hashlib.sha256(PATCH.encode()).hexdigest(),
        "SCM_REPO": str(repo / "sources" / "recipe-scm"),
        "SCM_COMMIT": _source(repo),
    }
    for folder in ("parts", "stacks", "images"):
        for path in sorted((EXAMPLE / folder).rglob("*")):
            dest = repo / folder / path.relative_to(EXAMPLE / folder)
            if path.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
            elif path.suffix == ".toml":
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(string.Template(path.read_text()).substitute(values))
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
    return values


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: world.py REPO_DIR (a folder that does not exist yet)")
    repo = Path(sys.argv[1]).resolve()
    world = make_world(repo.with_name(repo.name + ".world"))
    with serve(world.served) as url:
        render(repo, world, url)
        print(f"recipe-local: rendered into {repo}; serving {url} (Ctrl-C stops)", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
