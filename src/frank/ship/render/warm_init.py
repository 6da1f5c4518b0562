"""The warm-cache init step of a rendered pod: puts a warm cache's folder where the engine
reads it (``frank render k8s``; issue 55).

Rendered as the program text of ``python3 -c`` in the engine's own image, with its inputs as
arguments (data, never text put into the program), so it may use only the standard library
and the ``libzstd.so.1`` every base image carries (Debian's and Ubuntu's dpkg depend on it):
zstd is read through ``ctypes``. Arguments::

    pull REF LAYER DEST     fetch manifest REF (host/name@sha256:...) and its layer by digest
    volume DIR LAYER DEST   find the layer in DIR (an image volume of the artifact)

The manifest must hash to REF's digest and name LAYER; the layer must hash to LAYER; members
landing outside DEST, links pointing out, devices and hard links are refused; anything else
exits 1 with one line, and the pod does not start (a deployment never runs a cache that fails
its check). ``frank render`` picked REF for the deployment's device and checked its signature
where the image is attested.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, Any, NoReturn

CHUNK = 1 << 20
ACCEPT = "application/vnd.oci.image.manifest.v1+json"


def fail(why: str) -> NoReturn:
    sys.stderr.write("frank warm-cache init: " + why + "\n")
    sys.exit(1)


def _open(url: str, headers: dict[str, str]) -> Any:
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120)


def get(url: str, accept: str = "") -> Any:
    """GET with the registry's anonymous bearer token when it asks for one."""
    headers = {"Accept": accept} if accept else {}
    try:
        return _open(url, headers)
    except urllib.error.HTTPError as exc:
        challenge = exc.headers.get("WWW-Authenticate", "")
        if exc.code != 401 or not challenge.lower().startswith("bearer "):
            raise
    params = dict(p.split("=", 1) for p in challenge[7:].split(",") if "=" in p)
    params = {k.strip(): v.strip().strip('"') for k, v in params.items()}
    realm = params.pop("realm", "")
    with _open(realm + "?" + urllib.parse.urlencode(params), {}) as resp:
        doc = json.loads(resp.read())
    token = doc.get("token") or doc.get("access_token") or ""
    return _open(url, dict(headers, Authorization="Bearer " + token))


def base_url(host: str) -> str:
    local = host.split(":")[0] in ("localhost", "127.0.0.1")
    return ("http://" if local else "https://") + host


def pull(ref: str, layer: str, out: IO[bytes]) -> None:
    name, _, digest = ref.partition("@")
    host, _, repo = name.partition("/")
    root = base_url(host) + "/v2/" + repo
    with get(root + "/manifests/" + digest, ACCEPT) as resp:
        raw = resp.read()
    if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
        fail("the manifest of " + ref + " does not match its digest")
    if layer not in [d.get("digest") for d in json.loads(raw).get("layers") or []]:
        fail(ref + " does not name layer " + layer)
    with get(root + "/blobs/" + layer) as resp:
        copy_hashed(resp, out, layer)


def copy_hashed(src: Any, out: IO[bytes], layer: str) -> None:
    h = hashlib.sha256()
    while True:
        data = src.read(CHUNK)
        if not data:
            break
        h.update(data)
        out.write(data)
    out.flush()
    if "sha256:" + h.hexdigest() != layer:
        fail("the layer does not match its digest " + layer)


def from_volume(folder: str, layer: str, out: IO[bytes]) -> None:
    want = layer.split(":", 1)[1]
    for dirpath, _, files in os.walk(folder):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            h = hashlib.sha256()
            with open(path, "rb") as src:
                for data in iter(lambda: src.read(CHUNK), b""):
                    h.update(data)
            if h.hexdigest() == want:
                with open(path, "rb") as src:
                    copy_hashed(src, out, layer)
                return
    fail("no file in " + folder + " is layer " + layer)


class _Buf(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


def unzstd(src: IO[bytes], dst: IO[bytes]) -> None:
    """Decompress a zstd stream through libzstd's streaming API."""
    path = ctypes.util.find_library("zstd") or "libzstd.so.1"
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        fail("the image has no libzstd.so.1 to read the warm cache with")
    lib.ZSTD_createDStream.restype = ctypes.c_void_p
    lib.ZSTD_decompressStream.restype = ctypes.c_size_t
    lib.ZSTD_decompressStream.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Buf),
                                          ctypes.POINTER(_Buf)]
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    lib.ZSTD_freeDStream.argtypes = [ctypes.c_void_p]
    ds = lib.ZSTD_createDStream()
    lib.ZSTD_initDStream(ctypes.c_void_p(ds))
    outbuf = ctypes.create_string_buffer(CHUNK)
    last = 0
    try:
        while True:
            data = src.read(CHUNK)
            if not data:
                break
            inbuf = ctypes.create_string_buffer(data, len(data))
            i = _Buf(ctypes.cast(inbuf, ctypes.c_void_p), len(data), 0)
            while i.pos < i.size:
                o = _Buf(ctypes.cast(outbuf, ctypes.c_void_p), CHUNK, 0)
                last = lib.ZSTD_decompressStream(ctypes.c_void_p(ds), ctypes.byref(o),
                                                 ctypes.byref(i))
                if lib.ZSTD_isError(last):
                    fail("the layer is not a zstd stream")
                dst.write(outbuf.raw[:o.pos])
            while last:  # output the decoder still holds
                o = _Buf(ctypes.cast(outbuf, ctypes.c_void_p), CHUNK, 0)
                e = _Buf(None, 0, 0)
                last = lib.ZSTD_decompressStream(ctypes.c_void_p(ds), ctypes.byref(o),
                                                 ctypes.byref(e))
                if lib.ZSTD_isError(last) or not o.pos:
                    break
                dst.write(outbuf.raw[:o.pos])
    finally:
        lib.ZSTD_freeDStream(ctypes.c_void_p(ds))
    if last:
        fail("the layer is cut short")
    dst.flush()


def inside(rel: str, target: str) -> bool:
    if target.startswith("/"):
        return False
    return not posixpath.normpath(posixpath.join(posixpath.dirname(rel), target)) \
        .startswith("..")


def extract(tar_path: str, dest: str) -> None:
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            name = m.name
            if not name or name.startswith("/") or ".." in name.split("/"):
                fail("member " + repr(name) + " would land outside the folder")
            target = os.path.join(dest, name)
            if m.isdir():
                os.makedirs(target, exist_ok=True)
            elif m.issym():
                if not inside(name, m.linkname):
                    fail("link " + repr(name) + " points out of the folder")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(m.linkname, target)
            elif m.isreg():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tar.extractfile(m)
                if src is None:
                    fail("member " + repr(name) + " has no content")
                with open(target, "xb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
            else:
                fail("member " + repr(name) + " is neither a file, a folder nor a link")


def main(argv: list[str]) -> None:
    if len(argv) != 4 or argv[0] not in ("pull", "volume"):
        fail("usage: pull REF LAYER DEST | volume DIR LAYER DEST")
    mode, where, layer, dest = argv
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        blob, plain = os.path.join(tmp, "layer"), os.path.join(tmp, "layer.tar")
        try:
            with open(blob, "wb") as out:
                (pull if mode == "pull" else from_volume)(where, layer, out)
            with open(blob, "rb") as src, open(plain, "wb") as dst:
                unzstd(src, dst)
            os.unlink(blob)
            extract(plain, dest)
        except (OSError, tarfile.TarError, ValueError) as exc:
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    os.makedirs(os.path.join(dest, "home", ".cache"), exist_ok=True)
    print("frank warm-cache init: " + layer + " unpacked into " + dest)


if __name__ == "__main__":
    main(sys.argv[1:])
