"""compose, diff, revert, parts, show: real outputs on the shipped stacks."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tests.spine_helpers import frank, snapshot


def test_compose_writes_plan_and_complete_context(repo: Path) -> None:
    result = frank("compose", "stacks/candidate.toml", "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    out = Path(summary["out"])
    plan = json.loads((out / "plan.json").read_text())
    names = [layer["name"] for layer in plan["layers"]]
    engine = names.index("engine:vllm-base")  # the closure's layers come first
    assert engine > 3 and all(n.startswith("python:") for n in names[:engine])
    assert {"python:nvidia-cublas", "python:torch", "python:deps"} <= set(names[:engine])
    assert names[-2:] == ["frank:launcher", "frank:lock"]
    assert "kernel:rs8" in names and "patch:mhc-overlap" in names
    assert plan["engine"]["strategy"] == "release-wheel"
    layers = {layer["name"]: layer for layer in plan["layers"]}
    # every distribution of the closure in exactly one layer; the engine's own wheel pinned
    owned = [d for layer in plan["layers"] for d in layer["owns"]]
    assert len(owned) == len(set(owned)) and "vllm==0.24.0" in layers["engine:vllm-base"]["owns"]
    assert [w["sha256"] for w in layers["engine:vllm-base"]["wheels"]] == [
        "2d2831aeba311292250df0132dbc4d8e9f42c654536eaec48e6fe58acb1822cf"]
    assert any(d.startswith("torch==") for d in layers["python:torch"]["owns"])
    assert not any(layer["run"] or layer["impure"] for layer in plan["layers"])  # RUN-free
    dockerfile = (out / "context/Dockerfile").read_text()
    for layer in plan["layers"]:
        assert f"# layer {layer['index']}: {layer['name']}" in dockerfile
    assert "For frank's builders only" in dockerfile  # host-built layers are not staged here
    assert "RUN " not in dockerfile
    # every COPY source of a layer frank does not build on the host exists
    host = {f"layers/{layer['index']:02d}-{layer['name'].replace(':', '-')}/rootfs/"
            for layer in plan["layers"] if layer["wheels"] or layer["patch"]
            or layer["build_wheels"] or layer["kernel"] or layer.get("aot")
            or layer.get("extension")}
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and line.split()[1] not in host:
            assert (out / "context" / line.split()[1]).is_dir()
    staged = next(out.glob("context/layers/*data-expert-plan/rootfs/opt/frank/data"))
    assert (staged / "expert-plan.json").read_bytes() == \
        (repo / "parts/expert-plan/own-traffic.plan.json").read_bytes()
    assert (out / "frank.lock").read_text() == (repo / "stacks/candidate.lock").read_text()


def test_compose_locked_refuses_a_stale_lock(repo: Path) -> None:
    assert frank("lock", cwd=repo).code == 0
    (repo / "kernels/rs8/NEW.txt").write_text("x\n")
    before = snapshot(repo)
    result = frank("compose", "stacks/candidate.toml", "--locked", "--builder", "none", cwd=repo)
    assert result.code == 2 and "candidate.lock: --locked: lock is missing or out of date" \
        in result.err
    assert snapshot(repo) == before
    assert frank("compose", "stacks/served.toml", "--locked", "--builder", "none",
                 cwd=repo).code == 0


def test_diff_names_parts_fields_and_layers(repo: Path) -> None:
    stack = repo / "stacks/next.toml"
    stack.write_text('extends = "candidate.toml"\n[replace]\nexpert-plan = "published"\n'
                     '[env]\nNEW_SWITCH = "on"\n')
    result = frank("diff", "candidate", "stacks/next.toml", "--json", cwd=repo)
    assert result.code == 0
    diff = json.loads(result.out)
    change = next(p for p in diff["parts"] if p["part"] == "expert-plan")
    assert change["change"] == "version"
    assert change["old"] == "own-traffic" and change["new"] == "published"
    assert {"field": "spec.sha256",
            "old": "0b38192e126d903f9e12daba72e1c703783cf21ca54b2f84a0559ece9fb054bd",
            "new": "aa87cfebca482665f03abb2d11adcdf5ca6dd64cbd5187eff77ded0c603663f3"} \
        in change["fields"]
    assert {"field": "env.NEW_SWITCH", "old": None, "new": "on"} in diff["config"]
    states = {x["layer"]: x["state"] for x in diff["layers"]}
    assert states["data:expert-plan"] == "rebuilt"
    assert states["engine:vllm-base"] == "same" and states["kernel:rs8"] == "same"
    assert frank("diff", "candidate", "stacks/next.toml", "--exit-code", cwd=repo).code == 1
    assert frank("diff", "served", "served", "--exit-code", cwd=repo).code == 0
    table = frank("diff", "served", "candidate", cwd=repo)
    assert table.code == 0 and "rs8" in table.out and "added" in table.out


def test_diff_accepts_lock_files(repo: Path) -> None:
    assert frank("lock", cwd=repo).code == 0
    result = frank("diff", "stacks/served.lock", "stacks/candidate.lock", "--json", cwd=repo)
    assert result.code == 0
    assert [p["part"] for p in json.loads(result.out)["parts"]] == ["rs8"]


def test_revert_rs8_returns_candidate_to_served(repo: Path) -> None:
    assert frank("lock", cwd=repo).code == 0
    served = json.loads((repo / "stacks/served.lock").read_text())["digest"]
    dry = frank("revert", "rs8", "--stack", "stacks/candidate.toml", "--dry-run", cwd=repo)
    assert dry.code == 0 and "-rs8 = \"1\"" in dry.out
    assert "rs8" in (repo / "stacks/candidate.toml").read_text()  # dry run wrote nothing
    result = frank("revert", "rs8", "--stack", "stacks/candidate.toml", "--why", "test",
                   cwd=repo)
    assert result.code == 0, result.err
    text = (repo / "stacks/candidate.toml").read_text()
    assert "[add]" not in text and "rs8 = " not in text
    assert text.startswith("#:schema ../schemas/stack.json\n# The served stack plus rs8")
    assert json.loads((repo / "stacks/candidate.lock").read_text())["digest"] == served
    history = (repo / "stacks/candidate.history.jsonl").read_text().splitlines()
    entry = json.loads(history[-1])
    assert entry["part"] == "rs8" and entry["why"] == "test" and entry["digest_after"] == served
    assert frank("lock", "--check", cwd=repo).code == 0


def test_revert_to_an_earlier_version_in_a_child(repo: Path) -> None:
    result = frank("revert", "expert-plan", "--stack", "stacks/candidate.toml", cwd=repo)
    assert result.code == 0, result.err
    text = (repo / "stacks/candidate.toml").read_text()
    assert '[replace]\nexpert-plan = "published"' in text
    assert 'rs8 = "1"  # replaces vLLM\'s decode top-k' in text
    lock = json.loads((repo / "stacks/candidate.lock").read_text())
    assert {p["name"]: p["version"] for p in lock["parts"]}["expert-plan"] == "published"


def test_revert_inherited_part_with_remove(repo: Path) -> None:
    result = frank("revert", "cpu-experts-sched", "--stack", "stacks/candidate.toml", cwd=repo)
    assert result.code == 0, result.err
    assert 'remove = ["cpu-experts-sched"]' in (repo / "stacks/candidate.toml").read_text()


def test_revert_in_root_stack_edits_parts_in_place(repo: Path) -> None:
    assert frank("revert", "cpu-experts-sched", cwd=repo).code == 0
    text = (repo / "stacks/served.toml").read_text()
    assert "cpu-experts-sched" not in text and "# one request at a time" in text


def test_revert_of_absent_part_is_an_error(repo: Path) -> None:
    before = snapshot(repo)
    result = frank("revert", "rs8", cwd=repo)
    assert result.code == 2
    assert result.err.strip() == \
        "frank: error: stacks/served.toml: parts: the stack has no part 'rs8' to revert"
    assert snapshot(repo) == before


def test_revert_that_breaks_a_requirement_writes_nothing(repo: Path) -> None:
    before = snapshot(repo)
    result = frank("revert", "exl3-runtime", cwd=repo)
    assert result.code == 2
    assert ("exl3-runtime is required by exl3-ext (requires exl3-runtime), exl3-pack "
            "(requires exl3-runtime)") in result.err
    assert "--with-dependents" in result.err
    assert snapshot(repo) == before


def test_parts_and_show(repo: Path) -> None:
    rows = json.loads(frank("parts", "--json", cwd=repo).out)
    by = {(r["name"], r["version"]): r for r in rows}
    assert by[("rs8", "1")]["status"] == "candidate"
    assert by[("splitk-reduce", "1")]["status"] == "parked"
    assert by[("vllm-base", "783380af")]["status"] == "rejected"
    assert len([r for r in rows if r["status"] == "parked"]) == 3
    shown = json.loads(frank("show", "expert-plan", "--json", cwd=repo).out)
    assert [s["version"] for s in shown] == ["from-traces", "own-traffic", "published"]
    assert frank("show", "nope", cwd=repo).code == 2


def test_revert_relocks_stacks_that_extend_it(repo: Path) -> None:
    assert frank("lock", cwd=repo).code == 0
    result = frank("revert", "cpu-experts-sched", cwd=repo)
    assert result.code == 0 and "candidate.toml extends it: relocked" in result.out
    assert frank("lock", "--check", cwd=repo).code == 0
    lock = json.loads((repo / "stacks/candidate.lock").read_text())
    assert "cpu-experts-sched" not in [p["name"] for p in lock["parts"]]


def test_compiled_patch_forces_a_source_build_in_the_right_place(repo: Path) -> None:
    # a patch that really changes a compiled file (the claim is checked on the diff: the
    # served URL patch's own diff is Python-only, so claiming true for it is refused)
    diff = ("--- a/csrc/topk.cu\n+++ b/csrc/topk.cu\n@@ -1 +1 @@\n-int a;\n+int b;\n")
    (repo / "parts/mhc-overlap/compiled.patch").write_text(diff)
    manifest = repo / "parts/mhc-overlap/moet-6cefd6fe.toml"
    text = manifest.read_text().replace("touches_compiled = false", "touches_compiled = true")
    text = re.sub(r'^url = .*$', 'file = "parts/mhc-overlap/compiled.patch"', text, flags=re.M)
    text = re.sub(r'^sha256 = .*$', f'sha256 = "{hashlib.sha256(diff.encode()).hexdigest()}"',
                  text, flags=re.M)
    manifest.write_text(text)
    result = frank("compose", "stacks/candidate.toml", "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    plan = json.loads((Path(json.loads(result.out)["out"]) / "plan.json").read_text())
    assert plan["engine"]["strategy"] == "source"
    assert "mhc-overlap touch compiled code" in plan["engine"]["why"]
    names = [x["name"] for x in plan["layers"]]
    assert names[:3] == ["patch:mhc-overlap", "engine:vllm-base", "package:exl3-runtime"]
    assert [x["index"] for x in plan["layers"]] == list(range(1, len(names) + 1))
    engine = plan["layers"][1]
    assert any("git -C /opt/frank/vllm-src apply /opt/frank/patches/mhc-overlap.patch" in r
               for r in engine["run"])
    assert not any(r.startswith("patch ") for r in plan["layers"][0]["run"])
