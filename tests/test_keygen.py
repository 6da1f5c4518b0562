"""`frank keygen` writes to frank's config folder, refuses a git work tree unless asked, and
never prints the private key; attest and verify find that pair when given no key."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path


def run(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FRANK_SIGNING_KEY",
                                                              "FRANK_VERIFY_KEY")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"))
    return subprocess.run([sys.executable, "-m", "frank", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_keygen_defaults_to_the_config_folder_and_prints_no_key(tmp_path: Path) -> None:
    res = run("keygen", "--json", cwd=tmp_path, home=tmp_path / "home")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    key = tmp_path / "home" / "config" / "frank" / "frank.key"
    assert Path(shown["private"]) == key and Path(shown["public"]) == key.with_suffix(".pub")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert "PRIVATE KEY" in key.read_text()
    assert "PRIVATE" not in res.stdout + res.stderr
    assert not list(tmp_path.glob("*.key"))  # nothing in the folder it ran from


def test_keygen_refuses_a_git_work_tree_unless_asked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    res = run("keygen", "--out", "frank.key", cwd=repo, home=tmp_path / "home")
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("frank: error: --out: refusing to write a private key inside the "
                           f"git work tree {repo}")
    assert not (repo / "frank.key").exists()
    res = run("keygen", "--out", "sub/frank.key", "--in-repo", cwd=repo, home=tmp_path / "home")
    assert res.returncode == 0, res.stderr
    assert (repo / "sub" / "frank.key").is_file()


def test_attest_and_verify_name_the_default_key_when_there_is_none(tmp_path: Path) -> None:
    res = run("attest", str(tmp_path), cwd=tmp_path, home=tmp_path / "home")
    assert res.returncode == 2 and "frank keygen" in res.stderr
    assert str(tmp_path / "home" / "config" / "frank" / "frank.key") in res.stderr
    res = run("verify", str(tmp_path), cwd=tmp_path, home=tmp_path / "home")
    assert res.returncode == 2
    assert str(tmp_path / "home" / "config" / "frank" / "frank.pub") in res.stderr
