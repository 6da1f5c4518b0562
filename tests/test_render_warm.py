"""`frank render k8s` mounts the warm cache pushed for the deployment's device (issue 55).

The push record names the warm caches `frank push` attached; the render picks the one made
for the lock's target (served: two sm_120 GPUs), never one made elsewhere, and refuses to
guess between two. Kubernetes 1.35 and later get an image volume, earlier an init step that
pulls the artifact by digest; both validate against Kubernetes' schemas. The init step's own
program, taken from the rendered object and run here against a registry, unpacks exactly
the cache that was pushed, and refuses a layer that does not match its digest.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from frank.run import warmcache
from frank.run.device import Device, Gpu, cpu_identity
from frank.ship.pushes import PushedWarmCache, PushRecord, record_push
from frank.store.blobs import BlobStore
from tests.k8s_helpers import docs, kubernetes_validate, lock_digest
from tests.spine_helpers import frank
from tests.test_warm_cache import IMAGE, SUBJECT, cache_folder


def gpu(cc: str, driver: str = "580.65") -> str:
    return Device("gpu", gpus=(Gpu("NVIDIA GeForce RTX 5090", cc, driver, "13.0"),) * 2
                  ).canonical()


def warm(n: int, device: str) -> PushedWarmCache:
    return PushedWarmCache(digest="sha256:" + f"{n:02d}" * 32, layer="sha256:" + f"{n:02d}" * 32,
                           device=device, made_on=f"machine {n}")


def push(repo: Path, caches: list[PushedWarmCache], where: str = "reg.example/frank/served",
         digest: str = "sha256:" + "11" * 32) -> None:
    record_push(repo, PushRecord(stack="served", lock_digest=lock_digest(repo, "served"),
                                 repository=where, digest=digest, tags=["served"],
                                 time="2026-12-07T00:00:00Z", warm_caches=caches))


def pod(repo: Path, out: Path, *args: str) -> dict:
    res = frank("render", "k8s", "served", "--out", str(out), *args, cwd=repo)
    assert res.code == 0, res.err
    valid = kubernetes_validate(*sorted(out.iterdir()))
    assert valid.code == 0, valid.out + valid.err
    dep = next(d for d in docs(out) if d["kind"] == "Deployment")
    return dict(dep["spec"]["template"]["spec"])


def test_the_deployments_device_gets_its_warm_cache(repo: Path, tmp_path: Path) -> None:
    mine = warm(1, gpu("12.0"))
    push(repo, [warm(2, cpu_identity().canonical()), warm(3, gpu("9.0")), mine])
    spec = pod(repo, tmp_path / "a")
    init = {c["name"]: c for c in spec["initContainers"]}["warm-cache"]
    assert init["command"][:2] == ["python3", "-c"]
    assert init["args"] == ["pull", f"reg.example/frank/served@{mine.digest}", mine.layer,
                            "/frank/warm"]
    assert {"name": "warm", "emptyDir": {}} in spec["volumes"]
    engine = spec["containers"][0]
    assert {"mountPath": "/frank/warm", "name": "warm"} in engine["volumeMounts"]
    env = {e["name"]: e["value"] for e in engine["env"]}
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/frank/warm/inductor"
    assert env["HOME"] == "/frank/warm/home"

    spec = pod(repo, tmp_path / "b", "--kube-version", "1.35")
    assert {"name": "warm-artifact", "image": {"reference": f"reg.example/frank/served@"
            f"{mine.digest}", "pullPolicy": "IfNotPresent"}} in spec["volumes"]
    init = {c["name"]: c for c in spec["initContainers"]}["warm-cache"]
    assert init["args"] == ["volume", "/frank/warm-artifact", mine.layer, "/frank/warm"]
    assert {"mountPath": "/frank/warm-artifact", "name": "warm-artifact", "readOnly": True} \
        in init["volumeMounts"]

    spec = pod(repo, tmp_path / "c", "--warm-cache", "none")
    assert "warm" not in {v["name"] for v in spec["volumes"]}
    assert "warm-cache" not in {c["name"] for c in spec["initContainers"]}


def test_a_warm_cache_is_never_guessed_nor_taken_from_another_device(repo: Path) -> None:
    other_driver = warm(4, gpu("12.0", driver="590.10"))
    push(repo, [warm(1, gpu("12.0")), other_driver, warm(3, gpu("9.0"))])
    for args, says in [
        ((), "2 warm caches were pushed for this target"),
        (("--warm-cache", warm(3, "").digest), "was made on machine 3, not for this "
                                                "deployment's sm_120 x2"),
        (("--warm-cache", "sha256:" + "77" * 32), "is not a warm cache pushed with"),
        (("--warm-cache", "latest"), "is not auto, none or a digest"),
        (("--kube-version", "one"), "is not a Kubernetes version"),
    ]:
        res = frank("render", "k8s", "served", *args, cwd=repo)
        assert res.code == 2 and says in res.err, res.err
        assert res.err.startswith("frank: error: --") and len(res.err.splitlines()) == 1
    res = frank("render", "k8s", "served", "--warm-cache", other_driver.digest, cwd=repo)
    assert res.code == 0 and f"@{other_driver.digest}" in res.out, res.err


def test_the_init_step_unpacks_the_pushed_cache_by_digest(repo: Path, tmp_path: Path) -> None:
    from frank.ship import warmremote
    from tests.image.conftest import start_registry, stop

    device = Device("gpu", gpus=(Gpu("NVIDIA GeForce RTX 5090", "12.0", "580.65", "13.0"),) * 2)
    store = BlobStore(tmp_path / "store")
    folder = cache_folder(tmp_path / "cache")
    art = warmcache.make(store, folder, subject=SUBJECT, image=IMAGE, device=device)
    proc, where = start_registry(tmp_path / "registry")
    try:
        repository = f"{where}/frank/served"
        (sent,) = warmremote.push(store, repository, IMAGE, SUBJECT)
        push(repo, [PushedWarmCache(digest=sent.digest, layer=art.layer,
                                    device=device.canonical(), made_on=art.made_on)],
             where=repository)
        spec = pod(repo, tmp_path / "k8s")
        init = {c["name"]: c for c in spec["initContainers"]}["warm-cache"]

        def run(args: list[str], dest: Path) -> subprocess.CompletedProcess[str]:
            dest.mkdir()
            return subprocess.run(["python3", *init["command"][1:], *args[:-1], str(dest)],
                                  capture_output=True, text=True, timeout=120, check=False)

        done = run(init["args"], tmp_path / "warm")
        assert done.returncode == 0, done.stderr
        so = "vllm/torch_compile_cache/1f2e/kernel.so"
        assert (tmp_path / "warm" / so).read_bytes() == (folder / so).read_bytes()
        assert (tmp_path / "warm" / "home" / ".cache").is_dir()
        # a layer digest the manifest does not name, or a blob that is not it: refused
        bad = [*init["args"][:2], "sha256:" + "0" * 64, "/frank/warm"]
        done = run(bad, tmp_path / "bad")
        assert done.returncode == 1 and "does not name layer" in done.stderr
        vol = tmp_path / "vol"
        vol.mkdir()
        blob = store.path(art.layer).read_bytes()
        (vol / "blob").write_bytes(blob[: len(blob) // 2])
        done = run(["volume", str(vol), art.layer, "/frank/warm"], tmp_path / "cut")
        assert done.returncode == 1 and f"no file in {vol} is layer" in done.stderr
        (vol / "blob").write_bytes(blob)
        done = run(["volume", str(vol), art.layer, "/frank/warm"], tmp_path / "vwarm")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "vwarm" / so).read_bytes() == (folder / so).read_bytes()
    finally:
        stop(proc)
    assert json.loads(device.canonical())["kind"] == "gpu"
