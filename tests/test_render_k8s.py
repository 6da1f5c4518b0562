"""`frank render k8s`: a lock as Kubernetes objects that keep every pin, validated offline
against Kubernetes' own schemas (kubernetes-validate --strict) and, for LeaderWorkerSet,
its CRD's published schema (jsonschema). No API server is involved: none exists here."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml

from frank.ship.render.crd import lws_errors
from tests.k8s_helpers import docs, fake_layout, kubernetes_validate, lock_digest, pushed
from tests.spine_helpers import Result, audit_recorded, frank, snapshot

REVISION = "982b70452f399814f56b46272fd30394ae10d58c"  # exl3-pack's pinned hub revision


def by_kind(objs: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objs}


def test_render_refuses_an_image_not_built_or_not_pushed(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    before = snapshot(repo)
    res = frank("render", "k8s", "served", "--out", str(out), cwd=repo)
    assert res.code == 2 and res.out == ""
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert "is not built: run `frank compose stacks/served.toml`" in res.err
    assert not out.exists() and snapshot(repo) == before

    lock = lock_digest(repo, "served")
    fake_layout(repo, "served", "sha256:" + "0" * 64)  # built from another lock
    res = frank("render", "k8s", "served", cwd=repo)
    assert res.code == 2 and "not the current lock: run `frank compose" in res.err, res.err

    (repo / "out" / "served").rename(repo / "out" / "old")
    fake_layout(repo, "served", lock)  # built from this lock, never pushed
    res = frank("render", "k8s", "served", "--registry", "reg.example/frank/served", cwd=repo)
    assert res.code == 2, res.err
    assert ("built but not pushed to reg.example/frank/served: run `frank push served --to "
            "reg.example/frank/served`") in res.err

    pushed(repo, "served", lock, repository="other.example/frank/served")
    res = frank("render", "k8s", "served", "--registry", "reg.example/frank/served", cwd=repo)
    assert res.code == 2 and "not pushed to reg.example" in res.err  # only to another one
    res = frank("render", "k8s", "served", "--registry", "bad@repo", cwd=repo)
    assert res.code == 2 and res.err.startswith("frank: error: --registry: not a repository")


def test_push_records_what_the_registry_holds(repo: Path, tmp_path: Path) -> None:
    """`frank push` writes out/pushes.jsonl; skopeo is a stand-in here that writes the
    layout's digest as the registry's and answers its manifest when read back (no registry
    is run by this test)."""
    lock = lock_digest(repo, "served")
    layout = fake_layout(repo, "served", lock)
    manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    bin_dir = _fake_skopeo(tmp_path, manifest, layout / "blobs/sha256" / manifest[7:])
    res = _push_with(bin_dir, repo, "reg.example/frank/served")
    assert res.code == 0, res.err
    rec = json.loads((repo / "out" / "pushes.jsonl").read_text().splitlines()[-1])
    assert rec["lock_digest"] == lock and rec["digest"] == manifest
    assert rec["repository"] == "reg.example/frank/served" and rec["stack"] == "served"
    res = frank("render", "k8s", "served", cwd=repo)
    assert res.code == 0, res.err
    assert f"image: reg.example/frank/served@{manifest}" in res.out


def test_served_renders_valid_pinned_deterministic_objects(repo: Path, tmp_path: Path) -> None:
    lock = lock_digest(repo, "served")
    image = pushed(repo, "served", lock, repository="reg.example/frank/served")
    out = tmp_path / "k8s"
    res = frank("render", "k8s", "served", "--out", str(out), cwd=repo)
    assert res.code == 0, res.err
    files = sorted(p.name for p in out.iterdir())
    assert files == ["deployment-served.yaml", "persistentvolumeclaim-served-weights.yaml",
                     "service-served.yaml"]
    valid = kubernetes_validate(*sorted(out.iterdir()))
    assert valid.code == 0, valid.out + valid.err
    assert valid.out.count("passed") == 3, valid.out

    first = snapshot(out)
    res = frank("render", "k8s", "served", "--out", str(out), cwd=repo)
    assert res.code == 0 and "up to date" in res.out
    assert snapshot(out) == first  # byte-identical
    stream = frank("render", "k8s", "served", cwd=repo)
    assert stream.code == 0
    assert by_kind([d for d in yaml.safe_load_all(stream.out) if d]) == by_kind(docs(out))

    objs = by_kind(docs(out))
    dep = objs["Deployment"]
    ref = f"reg.example/frank/served@{image}"
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    meta = dep["spec"]["template"]["metadata"]
    assert meta["annotations"]["frank.dev/stack-digest"] == lock
    assert meta["annotations"]["frank.dev/image-digest"] == image
    assert meta["labels"]["frank.dev/stack"] == "served"
    assert meta["labels"]["part.frank.dev/exl3-pack"] == "2bpw-982b7045"
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.compute.major"] == "12"
    assert pod["nodeSelector"]["nvidia.com/gpu.compute.minor"] == "0"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    engine = pod["containers"][0]
    assert engine["image"] == ref and engine["command"] == ["vllm", "serve"]
    assert engine["args"][0] == (f"/frank/hub/models--sfxnz--DeepSeek-V4.1-Flash-EXL3/"
                                 f"snapshots/{REVISION}")
    assert engine["args"][engine["args"].index("--tensor-parallel-size") + 1] == "2"
    assert engine["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    env = {e["name"]: e["value"] for e in engine["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HUB_CACHE"] == "/frank/hub"
    assert env["VLLM_PLUGINS"] == "region_cache"
    assert env["EXL3_CPU_EXPERTS_SCHED"] == "2"
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert {"mountPath": "/frank/hub", "name": "weights", "readOnly": True} in \
        engine["volumeMounts"]
    init = pod["initContainers"][0]
    assert init["image"] == ref and "--fetch-only" in init["args"]
    assert init["command"] == ["python3", "/opt/frank/bin/frank-launch"]
    svc = objs["Service"]
    assert svc["spec"]["selector"] == {"frank.dev/stack": "served"}
    assert svc["spec"]["ports"][0]["port"] == 8000
    assert objs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_validation_catches_a_wrong_object(repo: Path, tmp_path: Path) -> None:
    """The checks can fail: a misspelt field and a wrong type are refused."""
    pushed(repo, "served", lock_digest(repo, "served"))
    out = tmp_path / "k8s"
    assert frank("render", "k8s", "served", "--out", str(out), cwd=repo).code == 0
    path = out / "deployment-served.yaml"
    dep = docs(path)[0]
    dep["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(dep))
    res = kubernetes_validate(bad)
    assert res.code != 0 and "imagee" in res.out + res.err
    dep = docs(path)[0]
    dep["spec"]["replicas"] = "one"
    bad.write_text(yaml.safe_dump(dep))
    assert kubernetes_validate(bad).code != 0


def _two_node(repo: Path) -> None:
    (repo / "stacks" / "served-2n.toml").write_text(
        'extends = "served.toml"\ndescription = "served over two nodes"\n\n'
        "[target]\nnodes = 2\nreplicas = 3\n\n[flags]\npipeline-parallel-size = 2\n")


def test_two_nodes_render_a_leader_worker_set(repo: Path, tmp_path: Path) -> None:
    _two_node(repo)
    lock = lock_digest(repo, "served-2n")
    assert lock != lock_digest(repo, "served")
    pushed(repo, "served-2n", lock)
    out = tmp_path / "k8s"
    res = frank("render", "k8s", "served-2n", "--out", str(out), cwd=repo)
    assert res.code == 0, res.err
    objs = by_kind(docs(out))
    assert set(objs) == {"LeaderWorkerSet", "Service", "PersistentVolumeClaim"}
    lws = objs["LeaderWorkerSet"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws_errors(lws) == []
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["replicas"] == 3
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    assert leader["args"][-2:] == ["--node-rank", "0"] and "startupProbe" in leader
    assert worker["args"][-3:] == ["--node-rank", "$(LWS_WORKER_INDEX)", "--headless"]
    assert "readinessProbe" not in worker
    assert objs["Service"]["spec"]["selector"] == {
        "frank.dev/stack": "served-2n", "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert objs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    rest = [p for p in sorted(out.iterdir()) if "leaderworkerset" not in p.name]
    valid = kubernetes_validate(*rest)
    assert valid.code == 0, valid.out + valid.err

    # the CRD schema catches what the API server would drop or refuse
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagee"] = 1
    errors = lws_errors(bad)
    assert any("restartPolicy" in e and "Sometimes" in e for e in errors), errors
    assert any("imagee" in e for e in errors), errors

    # back to one node: the LeaderWorkerSet file frank wrote goes, the Deployment comes
    (repo / "stacks" / "served-2n.toml").write_text(
        'extends = "served.toml"\n\n[target]\nreplicas = 3\n')
    pushed(repo, "served-2n", lock_digest(repo, "served-2n"))
    mine = out / "notes.yaml"
    mine.write_text("kind: ConfigMap\n")  # not frank's: left alone
    res = frank("render", "k8s", "served-2n", "--out", str(out), cwd=repo)
    assert res.code == 0, res.err
    assert "removed" in res.out and "leaderworkerset-served-2n.yaml" in res.out
    assert sorted(p.name for p in out.iterdir()) == [
        "deployment-served-2n.yaml", "notes.yaml", "persistentvolumeclaim-served-2n-weights.yaml",
        "service-served-2n.yaml"]
    assert by_kind(docs(out))["Deployment"]["spec"]["replicas"] == 3


def test_diff_names_the_objects_one_part_changes(repo: Path) -> None:
    old = repo / "old.lock"
    old.write_text((repo / "stacks" / "served.lock").read_text())
    stack = repo / "stacks" / "served.toml"
    stack.write_text(stack.read_text().replace('expert-plan = "own-traffic"',
                                               'expert-plan = "published"'))
    res = frank("diff", str(old), "served", "--k8s", "--json", cwd=repo)
    assert res.code == 0, res.err
    objects = {o["kind"]: o for o in json.loads(res.out)["k8s"]["objects"]}
    assert objects["Service"]["state"] == "same"
    assert objects["PersistentVolumeClaim"]["state"] == "same"
    dep = objects["Deployment"]
    assert dep["state"] == "changed" and dep["a"] == dep["b"] == "served"
    assert "spec.template.metadata.labels.part.frank.dev/expert-plan" in dep["fields"]
    assert "spec.template.spec.containers[engine].image" in dep["fields"]
    assert "spec.template.metadata.annotations.frank.dev/stack-digest" in dep["fields"]
    table = frank("diff", str(old), "served", "--k8s", cwd=repo)
    assert table.code == 0 and "kubernetes objects" in table.out
    plain = frank("diff", str(old), "served", "--json", cwd=repo)
    assert "k8s" not in json.loads(plain.out)  # only when asked


def test_wrong_inputs_are_one_line(repo: Path, tmp_path: Path) -> None:
    # an engine bound to loopback cannot be probed or served in a pod
    res = frank("render", "k8s", "served-cpu", cwd=repo)
    assert res.code == 2 and "flags.host: 127.0.0.1: in a pod" in res.err, res.err
    pushed(repo, "served", lock_digest(repo, "served"))
    for args, field in ((["--weights-size", "lots"], "--weights-size"),
                        (["--namespace", "Not_A_Name"], "--namespace")):
        res = frank("render", "k8s", "served", *args, cwd=repo)
        assert res.code == 2 and f"error: {field}:" in res.err, res.err
        assert len(res.err.strip().splitlines()) == 1
    stack = repo / "stacks" / "served.toml"
    stack.write_text(stack.read_text().replace("gpus = 2", "gpus = 2\nnodes = 0"))
    res = frank("render", "k8s", "served", cwd=repo)
    assert res.code == 2 and "served.toml: target.nodes" in res.err, res.err
    (repo / "out" / "pushes.jsonl").write_text("{not json\n")
    stack.write_text(stack.read_text().replace("\nnodes = 0", ""))
    res = frank("render", "k8s", "served", cwd=repo)
    assert res.code == 2 and "out/pushes.jsonl: line 1: not valid JSON" in res.err, res.err


def test_launcher_fetch_only_checks_the_weights(tmp_path: Path, capsys: object) -> None:
    """The init step (`frank-launch --fetch-only`) checks every sha256 and starts nothing."""
    import hashlib

    from frank.run import launch

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    spec = {"name": "w", "path": str(folder),
            "files": {"config.json": hashlib.sha256(b"{}").hexdigest()}}
    lock = tmp_path / "frank.lock"
    lock.write_text(json.dumps({"parts": [{"kind": "weights", "spec": spec}], "env": {},
                                "plugins": [], "flags": {}, "command": ["no-such-engine"]}))
    assert launch.main(["--lock", str(lock), "--fetch-only"]) == 0
    (folder / "config.json").write_text("{ }")
    assert launch.main(["--lock", str(lock), "--fetch-only"]) == 2


def test_dollar_parens_reach_the_pod_as_the_lock_says(repo: Path) -> None:
    """Issue 44 item 9: the kubelet expands ``$(VAR)`` in command, args and env values (and
    makes ``$$`` one ``$``): every ``$`` is written doubled, so the pod runs the lock."""
    (repo / "stacks/dollar.toml").write_text(
        'extends = "served.toml"\ncommand = ["sh", "-c", "echo $(id) $$"]\n'
        '[env]\nFRANK_T = "$(HOME)/a$$b"\n')
    lock = lock_digest(repo, "dollar")
    pushed(repo, "dollar", lock, repository="reg.example/frank/dollar")
    res = frank("render", "k8s", "dollar", cwd=repo)
    assert res.code == 0, res.err
    deployment = by_kind([d for d in yaml.safe_load_all(res.out) if d])["Deployment"]
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    assert engine["command"] == ["sh", "-c", "echo $$(id) $$$$"]
    env = {e["name"]: e["value"] for e in engine["env"]}
    assert env["FRANK_T"] == "$$(HOME)/a$$$$b"


def test_a_stack_name_no_service_may_have_is_one_line(repo: Path) -> None:
    (repo / "stacks/1served.toml").write_text('extends = "served.toml"\n')
    lock = lock_digest(repo, "1served")
    pushed(repo, "1served", lock, repository="reg.example/frank/one")
    res = frank("render", "k8s", "1served", cwd=repo)
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "cannot name Kubernetes objects" in res.err


def _fake_skopeo(tmp_path: Path, manifest: str, answer: Path) -> Path:
    """A stand-in skopeo: `copy` writes ``manifest`` as the registry's digest, `inspect
    --raw` answers ``answer``'s bytes (what the registry says it holds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "skopeo"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = inspect ]; then cat {answer}; exit 0; fi\n"
                    "while [ $# -gt 0 ]; do\n  if [ \"$1\" = --digestfile ]; then "
                    f"echo {manifest} > \"$2\"; fi\n  shift\ndone\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _push_with(bin_dir: Path, repo: Path, to: str) -> Result:
    """Push the fake layout (no layers: render reads only its lock digest) past the check
    `frank push` makes first: since issue 53 push audits the image against the stack's lock
    and derives it again, which a layout without layers never passes; these tests are about
    what happens after (the push, its read-back, the record), in `push.send`."""
    from frank.cli.push import send
    from frank.errors import FrankError

    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        send(repo, "served", repo / "out" / "served" / "image", to, (), True, "none")
        return Result(0, "", "")
    except FrankError as exc:
        return Result(exc.exit_code, "", f"frank: error: {exc.one_line()}\n")
    finally:
        os.chdir(cwd)
        os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]


def test_push_of_an_image_of_no_real_content_is_refused(repo: Path) -> None:
    """The push command's own check: the fake layout fails its audit against the stack's
    lock, whatever an audit.json says (issue 53)."""
    fake_layout(repo, "served", lock_digest(repo, "served"))
    audit_recorded(repo / "out" / "served" / "image", "served")
    res = frank("push", "--compression", "none", "served", "--to", "reg.example/x/y",
                cwd=repo)
    assert res.code != 0 and len(res.err.strip().splitlines()) == 1, res.err
    assert "refusing to push it" in res.err or "frank: error:" in res.err
    assert not (repo / "out" / "pushes.jsonl").exists()


def test_push_reads_back_what_it_pushed_before_recording(repo: Path, tmp_path: Path) -> None:
    """Issue 44 item 11: skopeo said the copy succeeded, the registry answers another
    manifest for the tag: refused in one line, and nothing recorded in out/pushes.jsonl."""
    layout = fake_layout(repo, "served", lock_digest(repo, "served"))
    manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"schemaVersion": 2}')
    res = _push_with(_fake_skopeo(tmp_path, manifest, wrong), repo, "reg.example/frank/served")
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "the registry answers" in res.err and manifest in res.err
    assert not (repo / "out" / "pushes.jsonl").exists()


def test_push_records_only_after_the_attestations_are_pushed(repo: Path,
                                                               tmp_path: Path) -> None:
    """A registry that takes the image and is gone before the attestations: no record (a
    recorded push is one `frank verify` finds whole)."""
    from frank.ship.attest import PREDICATE_SBOM
    from frank.ship.attest.layout import artifact, attach, image_descriptor
    from tests.image.image_helpers import free_port

    layout = fake_layout(repo, "served", lock_digest(repo, "served"))
    image = image_descriptor(layout)
    attach(layout, [artifact(image, PREDICATE_SBOM, b'{"payload": ""}', "2026-01-01T00:00:00Z")])
    blob = layout / "blobs/sha256" / image["digest"].split(":")[1]
    bin_dir = _fake_skopeo(tmp_path, image["digest"], blob)
    res = _push_with(bin_dir, repo, f"127.0.0.1:{free_port()}/frank/served")  # nobody there
    assert res.code != 0 and "Traceback" not in res.err, res.err
    assert not (repo / "out" / "pushes.jsonl").exists()
