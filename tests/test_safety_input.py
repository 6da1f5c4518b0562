"""Issue 35, security and bad input: nothing a manifest or stack says reaches outside the
repo or runs a command, and every bad input is one line naming file and field, exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import frank.assemble.context as context
from frank.errors import FrankError
from frank.hashing import sha256_tree
from frank.image.layer import collect
from tests.spine_helpers import Result, frank, snapshot

ENGINE = "parts/vllm-base/v0.24.0.toml"
PATCH = "parts/mhc-overlap/moet-6cefd6fe.toml"
PACKAGE = "parts/exl3-runtime/1.6.5.toml"
KERNEL = "parts/rs8/1.toml"
PLUGIN = "parts/region-cache/1.toml"
DATA = "parts/expert-plan/own-traffic.toml"
SERVED = "stacks/served.toml"
GITPKG = "parts/gitpkg/1.toml"

# The last one has no space: a grammar that only forbids whitespace lets it through.
HOSTILE = ("' ; touch CANARY", "$(touch CANARY)", "x\nRUN touch CANARY", "$(touch${IFS}CANARY)")


def toml_str(value: str) -> str:
    """A TOML basic string holding ``value`` exactly (JSON's escapes are TOML's)."""
    return json.dumps(value)


def set_key(root: Path, rel: str, key: str, value: str, section: str = "") -> None:
    """Replace the first ``key = ...`` line of ``rel`` (after ``[section]`` when given)
    with ``key = value`` (TOML text)."""
    path = root / rel
    text = path.read_text()
    start = text.index(f"[{section}]\n") if section else 0
    tail, n = re.subn(rf"(?m)^{re.escape(key)} = .*$", lambda _: f"{key} = {value}",
                      text[start:], count=1)
    assert n == 1, f"{key} not in {rel}"
    path.write_text(text[:start] + tail)


def one_line_error(result: Result, *needles: str) -> str:
    """The single error line of a refused command, checked to name every needle."""
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("frank: error: ") and "Traceback" not in result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def refused_without_writing(repo: Path, *args: str) -> Result:
    """Run a command that must be refused; nothing in the repo may change (the repo's own
    lock file, ``stacks/.frank.lock``, is not content)."""
    before = _content(repo)
    result = frank(*args, cwd=repo)
    assert _content(repo) == before
    return result


def _content(repo: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(repo).items() if not k.endswith(".frank.lock")}


# --- item 1: image paths stay inside the image --------------------------------------------

BINARY = '''kind = "binary"
name = "evil-bin"
version = "1"
summary = "a binary"
status = "candidate"
path = "parts/expert-plan/own-traffic.plan.json"
sha256 = "0b38192e126d903f9e12daba72e1c703783cf21ca54b2f84a0559ece9fb054bd"
archs = ["sm_120"]
dest = "DEST"
[provenance]
licence = "MIT"
[revert]
action = "remove"
'''


@pytest.mark.parametrize("dest", ["/../../../../ESCAPE", "/", "//", "/opt/../..", "relative"])
def test_data_dest_outside_the_image_is_refused(repo: Path, tmp_path: Path, dest: str) -> None:
    escape = tmp_path / "escaped"
    dest = dest.replace("ESCAPE", str(escape).lstrip("/"))
    set_key(repo, DATA, "dest", toml_str(dest))
    one_line_error(refused_without_writing(repo, "check"), DATA, "dest")
    one_line_error(refused_without_writing(repo, "compose", SERVED, "--builder", "none"),
                   DATA, "dest")
    assert not escape.exists()


@pytest.mark.parametrize("dest", ["/../../../tmp/x", "/", "/opt/x/../../.."])
def test_binary_dest_outside_the_image_is_refused(repo: Path, dest: str) -> None:
    (repo / "parts/evil-bin").mkdir()
    (repo / "parts/evil-bin/1.toml").write_text(BINARY.replace("DEST", dest))
    one_line_error(refused_without_writing(repo, "check"), "parts/evil-bin/1.toml", "dest")


def test_image_paths_are_normalized(repo: Path) -> None:
    set_key(repo, DATA, "dest", toml_str("/opt//frank/./data/expert-plan.json"))
    result = frank("compose", SERVED, "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    lock = json.loads((repo / "stacks/served.lock").read_text())
    plan = next(p for p in lock["parts"] if p["name"] == "expert-plan")
    assert plan["spec"]["dest"] == "/opt/frank/data/expert-plan.json"


def test_the_context_writer_refuses_an_escaping_path(tmp_path: Path) -> None:
    for dest in ("/../x", "/a/../../x", "/", ""):
        with pytest.raises(FrankError, match="leaves the image root"):
            context.image_path_under(tmp_path, dest, "data:x")
    assert context.image_path_under(tmp_path, "/opt/./x", "data:x") == tmp_path / "opt/x"


# --- item 2: symlinks in source trees -------------------------------------------------------

@pytest.mark.parametrize("target", ["/etc/passwd", "../../../../outside.txt", "sub/../../.."])
@pytest.mark.parametrize("git", [False, True])
def test_a_link_out_of_a_plugin_tree_is_refused(repo: Path, target: str, git: bool) -> None:
    (repo.parent / "outside.txt").write_text("secret\n")
    if git:
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "plugins/region_cache/sub").mkdir(exist_ok=True)
    os.symlink(target, repo / "plugins/region_cache/leak")
    line = one_line_error(refused_without_writing(repo, "compose", SERVED, "--builder", "none"),
                          PLUGIN, "entry_point.package", "points outside")
    assert "leak" in line


def test_a_link_out_of_a_kernel_tree_is_refused(repo: Path) -> None:
    os.symlink("/etc/hostname", repo / "kernels/rs8/leak")
    one_line_error(refused_without_writing(repo, "lock", "stacks/candidate.toml"), KERNEL,
                   "source", "points outside")


def test_an_inside_link_is_content_as_a_link(repo: Path, tmp_path: Path) -> None:
    tree = repo / "plugins/region_cache"
    before = sha256_tree(tree)
    os.symlink("pyproject.toml", tree / "alias.toml")
    as_link = sha256_tree(tree)
    (tree / "alias.toml").unlink()
    shutil.copy(tree / "pyproject.toml", tree / "alias.toml")
    assert len({before, as_link, sha256_tree(tree)}) == 3  # a link is not its target's bytes
    (tree / "alias.toml").unlink()
    os.symlink("pyproject.toml", tree / "alias.toml")
    layer = SimpleNamespace(name="plugin:x", generated=[],
                            files=[SimpleNamespace(src="plugins/region_cache", dest="/opt/x")])
    context.stage_layer(layer, repo, tmp_path / "rootfs")  # type: ignore[arg-type]
    staged = tmp_path / "rootfs/opt/x"
    assert os.readlink(staged / "alias.toml") == "pyproject.toml"
    members = {e.arcname: e for e in collect([(tmp_path / "rootfs", "/")])}
    assert members["opt/x/alias.toml"].kind == "symlink"
    assert members["opt/x/alias.toml"].linkname == "pyproject.toml"


def test_staging_refuses_a_link_out_of_its_tree(repo: Path, tmp_path: Path) -> None:
    os.symlink("/etc/passwd", repo / "plugins/region_cache/leak")
    layer = SimpleNamespace(name="plugin:x", generated=[],
                            files=[SimpleNamespace(src="plugins/region_cache", dest="/opt/x")])
    with pytest.raises(FrankError, match="points outside"):
        context.stage_layer(layer, repo, tmp_path / "rootfs")  # type: ignore[arg-type]
    assert not (tmp_path / "rootfs/opt/x/leak").exists()


def test_a_layer_refuses_a_link_out_of_its_tree(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    os.symlink("../secret", tmp_path / "tree/leak")
    with pytest.raises(FrankError, match="points outside"):
        collect([(tmp_path / "tree", "/opt/x")])


def test_a_tree_hash_refuses_a_link_out_of_it(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    os.symlink("/etc/passwd", tmp_path / "tree/leak")
    with pytest.raises(FrankError, match="points outside"):
        sha256_tree(tmp_path / "tree")


# --- item 3: free text never reaches a shell or a Dockerfile unchecked ----------------------

PACKAGE_GIT = '''kind = "package"
name = "gitpkg"
version = "1"
summary = "a package from git"
status = "candidate"
distribution = "gitpkg"
[git]
repo = "https://github.com/example/gitpkg"
commit = "ee0da84ab9e04ac7610e28580af62c365e898389"
subdirectory = "python"
[provenance]
licence = "MIT"
[revert]
action = "remove"
'''

# (file, [section.]key, how the hostile text is written into it) for every free-text field
# that reached a shell command or the Dockerfile.
FIELDS: dict[str, tuple[str, str, str]] = {
    "engine.release": (ENGINE, "release", "{}"),
    "engine.repo": (ENGINE, "repo", "https://github.com/x/y{}"),
    "engine.python": (ENGINE, "python", "3.11{}"),
    "engine.torch": (ENGINE, "torch", "{}"),
    "engine.cuda_arch_list": (ENGINE, "cuda_arch_list", "12.0{}"),
    "engine.wheel.url": (ENGINE, "wheel.url", "https://files.pythonhosted.org/vllm{}.whl"),
    "patch.url": (PATCH, "url", "https://example.org/p{}.patch"),
    "patch.source_repo": (PATCH, "source_repo", "https://example.org/r{}"),
    "package.distribution": (PACKAGE, "distribution", "exllamav3{}"),
    "package.wheel.url": (PACKAGE, "wheel.url", "https://files.pythonhosted.org/e{}.whl"),
    "package.git.subdirectory": (GITPKG, "git.subdirectory", "python{}"),
    "package.git.repo": (GITPKG, "git.repo", "https://github.com/e/g{}"),
    "kernel.build": (KERNEL, "build", "bash build.sh{}"),
    "plugin.entry_point.name": (PLUGIN, "entry_point.name", "region_cache{}"),
    "data.dest": (DATA, "dest", "/opt/frank/data/x{}"),
}


def _write_field(repo: Path, field: str, value: str) -> tuple[str, str]:
    """Write the hostile value; (file, the field name the error must give)."""
    file, where, shape = FIELDS[field]
    if file == GITPKG:
        (repo / "parts/gitpkg").mkdir(exist_ok=True)
        (repo / file).write_text(PACKAGE_GIT)
    section, _, key = where.rpartition(".")
    text = toml_str(shape.format(value))
    set_key(repo, file, key, f"[{text}]" if key == "cuda_arch_list" else text, section)
    return file, key


# A kernel's build is a shell command by design (it runs inside the image): only a newline,
# which would end its RUN and start an instruction of its own, is refused there.
CASES = [(f, v) for f in sorted(FIELDS) for v in HOSTILE if f != "kernel.build" or "\n" in v]


@pytest.mark.parametrize("field, value", CASES)
def test_hostile_free_text_is_refused(repo: Path, field: str, value: str) -> None:
    file, key = _write_field(repo, field, value)
    one_line_error(refused_without_writing(repo, "check"), file, key)
    if file != GITPKG:  # in the stack: compose refuses it before writing anything
        one_line_error(refused_without_writing(repo, "compose", "stacks/candidate.toml",
                                               "--builder", "none"), file, key)
    assert not list(repo.rglob("CANARY")) and not Path("CANARY").exists()


@pytest.mark.parametrize("name", ["x\nRUN touch CANARY", "a;touch CANARY", "Big Name", "$(x)"])
def test_a_stack_file_name_must_be_a_slug(repo: Path, name: str) -> None:
    stack = repo / "stacks" / f"{name}.toml"
    shutil.copy(repo / SERVED, stack)
    one_line_error(refused_without_writing(repo, "lock", str(stack)), "stack file's name")
    one_line_error(refused_without_writing(repo, "check"), "stack file's name")


@pytest.mark.parametrize("key, value", [
    ('"port; touch CANARY"', "1"),
    ("hostname", toml_str("0.0.0.0\nRUN touch CANARY")),
])
def test_hostile_flags_are_refused(repo: Path, key: str, value: str) -> None:
    set_key(repo, SERVED, "port", f"8000\n{key} = {value}")
    one_line_error(refused_without_writing(repo, "lock", SERVED), SERVED, "flags")


def test_the_dockerfile_writer_quotes_every_value() -> None:
    assert context.pip_step("/opt/a b;touch X") == "pip install --no-deps '/opt/a b;touch X'"
    assert context.comment("why\nRUN touch X") == "why RUN touch X"
    assert context.dockerfile_word('a"$HOME\\') == '"a\\"\\$HOME\\\\"'
    with pytest.raises(FrankError):
        context.dockerfile_word("a\nRUN x")
    with pytest.raises(FrankError):
        context.run_instruction(["true", "x\nRUN touch CANARY"])


# --- item 5: extends stays in the repo --------------------------------------------------------

@pytest.mark.parametrize("where", ["../../outside.toml", "ABSOLUTE"])
def test_extends_outside_the_repo_is_refused(repo: Path, where: str) -> None:
    outside = repo.parent / "outside.toml"
    shutil.copy(repo / SERVED, outside)
    where = str(outside) if where == "ABSOLUTE" else where
    (repo / "stacks/child.toml").write_text(f"extends = {toml_str(where)}\n")
    one_line_error(refused_without_writing(repo, "lock", "stacks/child.toml"),
                   "stacks/child.toml", "extends")


# --- item 10: undecodable files and runaway chains ---------------------------------------------

@pytest.mark.parametrize("rel", [SERVED, DATA, "images/bookworm-python-cc.toml"])  # served's base
def test_invalid_utf8_is_one_line(repo: Path, rel: str) -> None:
    path = repo / rel
    path.write_bytes(path.read_bytes() + b"\n# \xff\xfe\n")
    line = one_line_error(refused_without_writing(repo, "lock", SERVED), rel, "UTF-8")
    assert "0xff" in line


def test_invalid_utf8_in_a_lock(repo: Path) -> None:
    lock = repo / "stacks/served.lock"
    lock.write_bytes(lock.read_bytes()[:-2] + b"\xff\n")
    one_line_error(refused_without_writing(repo, "diff", "stacks/served.lock", "candidate"),
                   "stacks/served.lock", "UTF-8")
    result = refused_without_writing(repo, "lock", "--check", SERVED)
    assert result.code == 1 and "Traceback" not in result.err
    for args in (("compose", SERVED, "--locked", "--builder", "none"),
                 ("serve", SERVED, "--locked", "--print")):
        one_line_error(refused_without_writing(repo, *args), "served.lock", "--locked")


def test_a_lock_with_nan_is_not_json(repo: Path) -> None:
    lock = repo / "stacks/served.lock"
    lock.write_text(lock.read_text().replace('"port": 8000', '"port": NaN'))
    one_line_error(refused_without_writing(repo, "diff", "stacks/served.lock", "candidate"),
                   "stacks/served.lock", "NaN")


def test_a_long_extends_chain_is_one_line(repo: Path) -> None:
    for i in range(1, 1200):
        (repo / f"stacks/c{i}.toml").write_text(f'extends = "c{i - 1}.toml"\n')
    shutil.copy(repo / SERVED, repo / "stacks/c0.toml")
    one_line_error(refused_without_writing(repo, "lock", "stacks/c1199.toml"),
                   "stacks/c1199.toml", "extends", "deep")
    assert frank("lock", "stacks/c20.toml", cwd=repo).code == 0  # a sane depth still works


# --- item 11: values the engine would misread --------------------------------------------------

@pytest.mark.parametrize("edit, field", [
    (("port", "nan"), "flags"),
    (("port", "inf"), "flags"),
    (("port", "-inf"), "flags"),
    (("port", "8000\nPort = 8001"), "flags"),
    (("port", '8000\n[env]\nHF_HOME = "/a"\nhf_home = "/b"'), "env"),
    (("port", '8000\n[env]\nX = "a\\u0000b"'), "env"),
    (("port", '8000\n[env]\nX = "a\\nb"'), "env"),
    (("description", "\"x\"\ncommand = []"), "command"),
])
def test_misreadable_values_are_refused(repo: Path, edit: tuple[str, str], field: str) -> None:
    set_key(repo, SERVED, *edit)
    one_line_error(refused_without_writing(repo, "lock", SERVED), SERVED, field)


def test_case_clash_across_a_stack_and_its_parent(repo: Path) -> None:
    (repo / "stacks/child.toml").write_text('extends = "served.toml"\n[flags]\nPort = 1\n')
    one_line_error(refused_without_writing(repo, "lock", "stacks/child.toml"),
                   "stacks/child.toml", "flags", "differ only in case")


def test_nul_in_a_part_env_value_is_refused(repo: Path) -> None:
    set_key(repo, PLUGIN, "FRANK_REGION_CACHE_MAX_ENTRIES", toml_str("4096\x00"))
    one_line_error(refused_without_writing(repo, "check"), PLUGIN, "settings")


# --- item 12: env values are literal under both builders -----------------------------------------

ODD = "$HOME ${PATH} \"q\" 'single' `tick` $(touch CANARY) back\\slash \\$ end\\"


def _config_lines(dockerfile: str) -> list[str]:
    """The final stage's ENV and LABEL instructions, continuation lines included."""
    out, keep = [], False
    final = dockerfile.split("\nFROM ")[-1]
    for line in final.splitlines():
        keep = keep or line.startswith(("ENV ", "LABEL "))
        if keep:
            out.append(line)
            keep = line.endswith("\\")
    return out


def test_env_is_literal_in_the_dockerfile(repo: Path) -> None:
    set_key(repo, "stacks/smoke-cpu.toml", "HF_HUB_OFFLINE", f'"1"\nODD = {toml_str(ODD)}')
    result = frank("compose", "stacks/smoke-cpu.toml", "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    out = Path(json.loads(result.out)["out"])
    plan = json.loads((out / "plan.json").read_text())
    assert plan["config"]["env"]["ODD"] == ODD  # what the embedded builder writes
    dockerfile = (out / "context/Dockerfile").read_text()
    assert f"ODD={context.dockerfile_word(ODD)}" in dockerfile
    if shutil.which("buildah") is None or os.geteuid() != 0:
        pytest.skip("buildah (as root) is needed to read the Dockerfile back")
    ctx = repo / "bud"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\n" + "\n".join(_config_lines(dockerfile)))
    store = ["--root", str(repo / "bud-root"), "--runroot", str(repo / "bud-run"),
             "--storage-driver", "vfs"]
    subprocess.run(["buildah", *store, "bud", "--isolation", "chroot", "-q", "-t", "odd",
                    str(ctx)], check=True, capture_output=True, timeout=120)
    info = json.loads(subprocess.run(["buildah", *store, "inspect", "odd"], check=True,
                                     capture_output=True, timeout=60).stdout)
    config = info["OCIv1"]["config"]
    env = dict(e.split("=", 1) for e in config["Env"] if not e.startswith("PATH="))
    assert env == plan["config"]["env"]
    labels = {k: v for k, v in config["Labels"].items() if not k.startswith("io.buildah")}
    assert labels == plan["config"]["labels"]
    assert not list(repo.rglob("CANARY"))


# --- items 13 and 14: local errors stay local; usage errors are one line --------------------------

def test_inspect_of_a_missing_path_asks_no_registry(repo: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "skopeo-ran"
    (bin_dir / "skopeo").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (bin_dir / "skopeo").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{old}"
    try:
        for arg in ("out/missing/image", "./nothing", "missing"):
            one_line_error(frank("inspect", arg, cwd=repo), arg, "no such OCI layout")
        (repo / "afile").write_text("x")
        one_line_error(frank("inspect", "afile", cwd=repo), "not an OCI layout")
    finally:
        os.environ["PATH"] = old
    assert not marker.exists()


@pytest.mark.parametrize("args, needle", [
    (("compose", "--builder", "bogus", SERVED), "--builder"),
    (("compose",), "Missing argument"),
    (("lock", "--bogus"), "--bogus"),
    (("nosuch",), "nosuch"),
])
def test_usage_errors_are_one_line(repo: Path, args: tuple[str, ...], needle: str) -> None:
    one_line_error(refused_without_writing(repo, *args), needle)


# --- issue 44: nesting no reader copes with, a stack linked in from another repo ---------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("args", [("check",), ("lock", "stacks/deep.toml"),
                                  ("compose", "stacks/deep.toml", "--builder", "none"),
                                  ("lock", "--check", "stacks/deep.toml"),
                                  ("diff", "stacks/deep.toml", "served")])
def test_a_stack_nested_100000_deep_is_one_line(repo: Path, args: tuple[str, ...]) -> None:
    (repo / "stacks/deep.toml").write_text(f'extends = "served.toml"\nx = {DEEP}\n')
    one_line_error(refused_without_writing(repo, *args), "stacks/deep.toml", "nested")


@pytest.mark.parametrize("args", [("lock", "--check", "served"), ("diff", "stacks/served.lock",
                                                                 "candidate"),
                                  ("compose", "served", "--locked", "--builder", "none")])
def test_a_lock_nested_100000_deep_is_one_line(repo: Path, args: tuple[str, ...]) -> None:
    lock = repo / "stacks/served.lock"
    text = lock.read_text()
    lock.write_text(text[:text.rindex("}")] + f',"x":{DEEP}}}\n')
    result = refused_without_writing(repo, *args)
    assert result.code in (1, 2) and len(result.err.strip().splitlines()) == 1, result
    assert "Traceback" not in result.err and "RecursionError" not in result.err


def test_a_stack_linked_from_another_repo_is_refused(repo: Path, tmp_path: Path) -> None:
    """A stack file that is a link into another repository would make compose write that
    repository's lock and out/: refused, as an ``extends`` outside the repo is."""
    from tests.spine_helpers import copy_repo

    other = copy_repo(tmp_path / "other")
    (repo / "stacks/linked.toml").symlink_to(other / "stacks/smoke-cpu.toml")
    before = snapshot(other)
    for args in (("lock", "stacks/linked.toml"), ("lock", "linked"),
                 ("compose", "stacks/linked.toml", "--builder", "none"), ("check",)):
        one_line_error(refused_without_writing(repo, *args), "linked.toml", "outside the repo")
    assert snapshot(other) == before and not (other / "out").exists()


def test_a_hand_edited_wheel_hash_in_a_pylock_is_stale(repo: Path) -> None:
    """The pylock's ``[tool.frank] request`` cannot show an edited hash; the lock's record
    of the pylock's bytes for that request does: `frank lock` resolves it again (it kept
    the edit, and `lock --check` then said up to date; only the fetch refused it)."""
    pylock = repo / "stacks/pylock.served-cpu.toml"
    text = pylock.read_text()
    digest = re.search(r'sha256 = "([0-9a-f]{64})"', text)
    assert digest is not None
    edited = ("1" if digest.group(1)[0] == "0" else "0") + digest.group(1)[1:]
    lock = (repo / "stacks/served-cpu.lock").read_bytes()
    pylock.write_text(text.replace(digest.group(1), edited, 1))
    relocked = frank("lock", "stacks/served-cpu.toml", cwd=repo)
    assert relocked.code == 0, relocked.err
    assert edited not in pylock.read_text()  # resolved again, not kept
    assert (repo / "stacks/served-cpu.lock").read_bytes() == lock
    assert frank("lock", "--check", "stacks/served-cpu.toml", cwd=repo).code == 0


@pytest.mark.parametrize("value", ["nan", "-5", "inf", "0"])
def test_a_deadline_that_never_comes_is_refused(repo: Path, value: str) -> None:
    for args in (("run", "smoke-cpu", "--print", f"--wait-ready={value}"),
                 ("serve", "smoke-cpu", f"--ready-timeout={value}")):
        one_line_error(frank(*args, cwd=repo), "positive, finite number of seconds")


# --- issue 53: a link anywhere a path enters may not lead out of the repo --------------------

def _link_out(repo: Path, other: Path, rel: str) -> None:
    """Replace ``rel`` in ``repo`` by a link to the same path in ``other``."""
    target, link = other / rel, repo / rel
    if link.is_dir():
        shutil.rmtree(link)
    elif link.exists():
        link.unlink()
    link.symlink_to(target)


@pytest.mark.parametrize(("rel", "args", "needles"), [
    ("stacks/sub", ("lock", "stacks/sub/smoke-cpu.toml"), ("stacks/sub/smoke-cpu.toml",)),
    ("stacks/sub", ("compose", "stacks/sub/smoke-cpu.toml", "--builder", "none"),
     ("stacks/sub/smoke-cpu.toml",)),
    ("stacks/sub", ("lock", "--check", "stacks/sub/smoke-cpu.toml"),
     ("stacks/sub/smoke-cpu.toml",)),
    ("stacks/sub", ("revert", "--stack", "stacks/sub/smoke-cpu.toml", "patch-header"),
     ("stacks/sub/smoke-cpu.toml",)),
    ("parts/patch-header", ("check",), ("parts/patch-header/1.toml", "parts")),
    ("parts/patch-header/app-header.patch", ("lock", "stacks/served-cpu.toml"),
     ("parts/patch-header/1.toml", "file")),
    ("plugins/region_cache", ("lock", "stacks/smoke-cpu.toml"),
     ("parts/region-cache/1.toml", "package")),
    ("out", ("compose", "stacks/smoke-cpu.toml", "--builder", "none"), ("out/smoke-cpu", "out")),
], ids=["stacks-lock", "stacks-compose", "stacks-check", "stacks-revert", "part", "patch-file",
        "source-folder", "out"])
def test_a_link_out_of_the_repo_is_refused_where_it_enters(
        repo: Path, tmp_path: Path, rel: str, args: tuple[str, ...],
        needles: tuple[str, ...]) -> None:
    """A folder or file of the repo that is a link into another repository: that one is
    neither read for the stack nor written (its lock, out/, history), one line, exit 2."""
    from tests.spine_helpers import copy_repo

    other = copy_repo(tmp_path / "other")
    (other / "out/smoke-cpu").mkdir(parents=True)
    if rel == "stacks/sub":
        (repo / rel).symlink_to(other / "stacks")
    else:
        _link_out(repo, other, rel)
    before = snapshot(other)
    one_line_error(refused_without_writing(repo, *args), "outside the repo", *needles)
    assert snapshot(other) == before


@pytest.mark.parametrize(("rel", "args"), [
    ("stacks/smoke-cpu.history.jsonl", ("revert", "--stack", "stacks/smoke-cpu.toml", "--undo")),
    ("stacks/.frank-journal.json", ("lock", "stacks/smoke-cpu.toml")),
    ("stacks/served.lock", ("diff", "stacks/served.lock", "candidate")),
], ids=["history", "journal", "lock"])
def test_a_record_nested_100000_deep_is_one_line_naming_it(repo: Path, rel: str,
                                                           args: tuple[str, ...]) -> None:
    """Issue 53: a record frank reads (history, the journal, a lock) nested deeper than a
    reader copes with: one line that names the file, not only how deep it is."""
    (repo / rel).write_text(DEEP + "\n")
    one_line_error(refused_without_writing(repo, *args), rel)
