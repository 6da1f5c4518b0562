"""Issue 31's wrong answers (items 7, 8, 11, 12): each reproduced as a user meets it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.spine_helpers import frank, snapshot

OFFICIAL = ("docker.io/vllm/vllm-openai@sha256:"
            "f9de5cd9fa907fbf6dbba691eb7db095d48ad58ea283e3eba7142f9a91e186e8")
ENGINE_IMAGE = f'''kind = "engine"
name = "vllm-image"
version = "v0.24.0"
summary = "vLLM 0.24.0 as the official engine image"
status = "candidate"
repo = "https://github.com/vllm-project/vllm"
commit = "ee0da84ab9e04ac7610e28580af62c365e898389"
image = "{OFFICIAL}"
python = "3.12"
torch = "2.11.0"
cuda = "13.0.2"
cuda_arch_list = ["12.0"]
'''
# what every test manifest here ends with
TAIL = '[provenance]\nlicence = "Apache-2.0"\n\n[revert]\naction = "remove"\n'


def manifest(kind: str, name: str, body: str) -> str:
    """A candidate part's manifest at version 1: ``body`` holds its kind's own fields."""
    return (f'kind = "{kind}"\nname = "{name}"\nversion = "1"\nsummary = "a test part"\n'
            f'status = "candidate"\n{body}\n{TAIL}')


def image_stack(repo: Path, base: str, patches: tuple[str, ...] = ()) -> str:
    """A stack whose engine is the official image, on the base image definition ``base``."""
    (repo / "parts/vllm-image").mkdir()
    (repo / "parts/vllm-image/v0.24.0.toml").write_text(
        ENGINE_IMAGE + TAIL)  # a patch is a part of the stack; the engine lists none
    listed = "".join(f'{p} = "1"\n' for p in patches)
    (repo / "stacks/img.toml").write_text(f'''[model]
name = "m"
[target]
arch = "sm_120"
gpus = 1
[image]
base = "{base}"
[parts]
vllm-image = "v0.24.0"
{listed}''')
    return "stacks/img.toml"


def compiled_patch(repo: Path, name: str = "own-op") -> None:
    """A patch of vLLM's C++ that the official image's prebuilt code cannot take."""
    folder = repo / "parts" / name
    folder.mkdir()
    diff = ("--- a/csrc/ops.h\n+++ b/csrc/ops.h\n@@ -1,1 +1,2 @@\n int a;\n+int b;\n")
    (folder / "ops.patch").write_text(diff)
    sha = hashlib.sha256(diff.encode()).hexdigest()
    (folder / "1.toml").write_text(manifest("patch", name, f'''source_repo = "https://github.com/vllm-project/vllm"
file = "parts/{name}/ops.patch"
sha256 = "{sha}"
applies_to = ["ee0da84ab9e04ac7610e28580af62c365e898389"]
touches_compiled = true'''))


def composed(repo: Path, stack: str) -> dict:
    """The build plan `frank compose` writes for ``stack``."""
    result = frank("compose", stack, "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    return json.loads((Path(json.loads(result.out)["out"]) / "plan.json").read_text())


def lock_error(repo: Path, manifest: str, old: str, new: str, stack: str) -> str:
    """The one-line error `frank lock STACK` gives once ``manifest`` has ``new`` for ``old``."""
    path = repo / manifest
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    result = frank("lock", stack, cwd=repo)
    assert result.code == 2, result.out
    return result.err


# --- item 7: the engine image and the stack's base ---------------------------------------

def test_engine_image_on_another_base_is_an_error_naming_both_fields(repo: Path) -> None:
    stack = image_stack(repo, "bookworm-python")
    before = snapshot(repo)
    result = frank("compose", stack, "--builder", "none", cwd=repo)
    assert result.code == 2, result.out
    err = result.err.strip()
    assert err.startswith("frank: error: stacks/img.toml: image.base: ")
    assert "'bookworm-python'" in err and "parts/vllm-image/v0.24.0.toml" in err
    assert f"image = {OFFICIAL}" in err
    assert "images/vllm-openai-v0.24.0.toml" in err  # the definition that would fit
    assert len(err.splitlines()) == 1
    assert snapshot(repo) == before
    assert frank("lock", stack, cwd=repo).code == 2  # refused at lock, not only compose


def test_engine_image_is_the_dockerfiles_base_when_the_stack_names_it(repo: Path) -> None:
    stack = image_stack(repo, "vllm-openai-v0.24.0")
    result = frank("compose", stack, "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    out = Path(json.loads(result.out)["out"])
    assert json.loads(result.out)["engine"]["strategy"] == "image"
    dockerfile = (out / "context/Dockerfile").read_text()
    assert f'ARG BASE_IMAGE="{OFFICIAL}"' in dockerfile


# --- item 8: touches_compiled on the image path -------------------------------------------

def test_compiled_patch_on_the_engine_image_is_refused(repo: Path) -> None:
    compiled_patch(repo)
    stack = image_stack(repo, "vllm-openai-v0.24.0", patches=("own-op",))
    result = frank("compose", stack, "--builder", "none", "--json", cwd=repo)
    assert result.code == 2, result.out
    err = result.err.strip()
    assert "Python-only" not in result.out + err
    assert err.startswith("frank: error: parts/own-op/1.toml: touches_compiled: ")
    assert "vllm-image" in err and f"image = {OFFICIAL}" in err
    assert "parts/vllm-image/v0.24.0.toml" in err


def test_compiled_patch_layer_never_says_python_only(repo: Path) -> None:
    # (mhc-overlap's own claim cannot be flipped: lock checks a URL patch's claim on its diff)
    compiled_patch(repo)
    stack = repo / "stacks/served.toml"
    stack.write_text(stack.read_text().replace("[parts]\n", '[parts]\nown-op = "1"\n', 1))
    patch = next(x for x in composed(repo, "stacks/served.toml")["layers"]
                 if x["name"] == "patch:own-op")
    assert "Python-only" not in patch["why"]
    assert "source build" in patch["why"]


# --- item 11: errors that name the wrong thing --------------------------------------------

def binary_part(repo: Path, path: str) -> str:
    (repo / "parts/cubins").mkdir()
    (repo / "parts/cubins/1.toml").write_text(manifest("binary", "cubins", f'''path = "{path}"
archs = ["sm_120"]
dest = "/opt/cubins/a.cubin"'''))
    (repo / "stacks/bin.toml").write_text('extends = "served.toml"\n[add]\ncubins = "1"\n')
    return "stacks/bin.toml"


def test_binary_missing_path_is_named_under_path(repo: Path) -> None:
    result = frank("lock", binary_part(repo, "parts/cubins/nope.cubin"), cwd=repo)
    assert result.code == 2
    assert result.err.startswith("frank: error: parts/cubins/1.toml: path: "), result.err
    assert "sha256" not in result.err


def test_binary_hash_mismatch_is_still_named_under_sha256(repo: Path) -> None:
    stack = binary_part(repo, "parts/cubins/a.cubin")
    (repo / "parts/cubins/a.cubin").write_bytes(b"\x7fELF")
    manifest = repo / "parts/cubins/1.toml"
    manifest.write_text(manifest.read_text().replace(
        'archs', 'sha256 = "' + "0" * 64 + '"\narchs'))
    result = frank("lock", stack, cwd=repo)
    assert result.code == 2
    assert result.err.startswith("frank: error: parts/cubins/1.toml: sha256: sha256 mismatch")


def test_revert_errors_name_the_real_stack_file(repo: Path) -> None:
    before = snapshot(repo)
    result = frank("revert", "exl3-runtime", "--stack", "stacks/served.toml", cwd=repo)
    assert result.code == 2
    assert "frank-tmp" not in result.err and ".revert" not in result.err, result.err
    assert result.err.startswith("frank: error: stacks/served.toml: parts.exl3-runtime: "
                                 "exl3-runtime is required by exl3-ext")
    assert snapshot(repo) == before


def test_revert_error_in_a_child_names_the_child(repo: Path) -> None:
    stack = binary_part(repo, "parts/cubins/a.cubin")
    (repo / "parts/cubins/a.cubin").write_bytes(b"\x7fELF")
    one = (repo / "parts/cubins/1.toml").read_text()
    # version 2 reverts to version 1, which needs rs8 (not in this stack)
    (repo / "parts/cubins/2.toml").write_text(one.replace('version = "1"', 'version = "2"')
                                              .replace('action = "remove"',
                                                       'action = "version"\nto = "1"'))
    (repo / "parts/cubins/1.toml").write_text(one.replace('status = "candidate"',
                                                          'status = "candidate"\n'
                                                          'requires = ["rs8"]'))
    (repo / stack).write_text('extends = "served.toml"\n[add]\ncubins = "2"\n')
    result = frank("revert", "cubins", "--stack", stack, cwd=repo)
    assert result.code == 2
    assert result.err.strip() == (
        "frank: error: stacks/bin.toml: add.cubins: cubins requires rs8, which the stack "
        "lacks (declared in parts/cubins/1.toml)")


# --- item 12: layer order and kernel plugins -----------------------------------------------

def test_layer_order_honours_requires(repo: Path) -> None:
    # a plugin that needs a data part: by kind it would come first (plugins before data)
    manifest = repo / "parts/region-cache/1.toml"
    manifest.write_text(manifest.read_text().replace(
        'replaces = "vllm:prompt-tokenization"',
        'replaces = "vllm:prompt-tokenization"\nrequires = ["expert-plan"]'))
    assert frank("lock", "stacks/served.toml", cwd=repo).code == 0
    parts = [p["name"] for p in json.loads((repo / "stacks/served.lock").read_text())["parts"]]
    assert parts.index("expert-plan") < parts.index("region-cache")
    # stable: everything else keeps its kind order
    assert parts.index("vllm-base") < parts.index("mhc-overlap") < parts.index("exl3-runtime")
    layers = [x["name"] for x in composed(repo, "stacks/served.toml")["layers"]]
    assert layers.index("data:expert-plan") < layers.index("plugin:region-cache")


def test_requires_cycle_is_an_error_naming_both(repo: Path) -> None:
    for path, other in (("parts/region-cache/1.toml", "expert-plan"),
                        ("parts/expert-plan/own-traffic.toml", "region-cache")):
        manifest = repo / path
        text = manifest.read_text()
        manifest.write_text(text.replace('status = "served"',
                                         f'status = "served"\nrequires = ["{other}"]', 1))
    result = frank("lock", "stacks/served.toml", cwd=repo)
    assert result.code == 2
    assert "requires" in result.err and "expert-plan" in result.err \
        and "region-cache" in result.err and "cycle" in result.err, result.err


def test_kernel_plugin_package_must_exist(repo: Path) -> None:
    err = lock_error(repo, "parts/rs8/1.toml", 'package = "kernels/rs8/python"',
                     'package = "kernels/rs8/nope"', "stacks/candidate.toml")
    assert err.startswith("frank: error: parts/rs8/1.toml: plugin.package: "), err


def test_kernel_plugin_name_must_be_an_entry_point_of_its_package(repo: Path) -> None:
    group = 'group = "vllm.general_plugins"\n'
    err = lock_error(repo, "parts/rs8/1.toml", f'{group}name = "rs8"', f'{group}name = "rs9"',
                     "stacks/candidate.toml")
    assert err.startswith("frank: error: parts/rs8/1.toml: plugin.name: "), err
    assert "'rs9'" in err and "vllm.general_plugins" in err \
        and "kernels/rs8/python/pyproject.toml" in err


def test_plugin_name_must_be_an_entry_point_of_its_package(repo: Path) -> None:
    err = lock_error(repo, "parts/region-cache/1.toml", 'name = "region_cache"',
                     'name = "region-cache"', "stacks/served.toml")
    assert err.startswith("frank: error: parts/region-cache/1.toml: entry_point.name: "), err
