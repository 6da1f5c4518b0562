"""The stack names its warm workload (``[warm]``, issue 55): `frank warm` sends it.

Merged field by field down ``extends``, the options over it, and what is sent is recorded
in the artifact; a bad value is refused in one line naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.model.stack import load_stack
from frank.run import warmcache
from frank.run.device import cpu_identity
from frank.run.warm import Workload
from frank.store.blobs import BlobStore
from tests.test_warm_cache import IMAGE, SUBJECT, cache_folder

ROOT_STACK = """[model]
name = "tiny"
[target]
arch = "cpu"
gpus = 0
[image]
base = "bookworm-python"
[parts]
"""


def repo(tmp_path: Path, warm: str, child: str = "") -> Path:
    (tmp_path / "parts").mkdir(parents=True)
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "base.toml").write_text(ROOT_STACK + warm)
    (tmp_path / "stacks" / "child.toml").write_text('extends = "base.toml"\n' + child)
    return tmp_path / "stacks"


def test_the_stacks_workload_is_what_frank_warm_sends(tmp_path: Path) -> None:
    stacks = repo(tmp_path, "[warm]\nprompts = [4, 40]\nmax_tokens = 3\n",
                  "[warm]\nmax_tokens = 2\n")
    base, child = load_stack(stacks / "base.toml"), load_stack(stacks / "child.toml")
    assert (base.warm.prompts, base.warm.max_tokens) == ([4, 40], 3)
    assert (child.warm.prompts, child.warm.max_tokens) == ([4, 40], 2)  # field by field
    sent = Workload.of(child.warm).bodies("tiny", 4096)
    assert [len(b["messages"][0]["content"].split()) for b in sent] == [4, 40]
    assert {b["max_tokens"] for b in sent} == {2}
    assert Workload.of(child.warm, prompts=(9,)) == Workload((9,), 2)  # --requests wins
    assert Workload.of(None) == Workload((8, 128, 512), 16)  # a layout: the default
    plain = load_stack(repo(tmp_path / "plain", "").joinpath("child.toml"))
    assert Workload.of(plain.warm) == Workload()
    store = BlobStore(tmp_path / "store")
    art = warmcache.make(store, cache_folder(tmp_path / "cache"), subject=SUBJECT, image=IMAGE,
                         device=cpu_identity(), workload=Workload.of(child.warm).as_json())
    assert json.loads(art.doc["annotations"][warmcache.WORKLOAD_ANNOTATION]) == \
        {"prompts": [4, 40], "max_tokens": 2}


@pytest.mark.parametrize(("warm", "field"), [
    ("prompts = [0]", "warm.prompts.0"),
    ("prompts = []", "warm.prompts"),
    ("max_tokens = 99999", "warm.max_tokens"),
    ("requests = 3", "warm.requests"),
])
def test_a_bad_workload_is_refused_in_one_line(tmp_path: Path, warm: str, field: str) -> None:
    stacks = repo(tmp_path, f"[warm]\n{warm}\n")
    with pytest.raises(FrankError) as caught:
        load_stack(stacks / "child.toml")
    text = str(caught.value)
    assert "\n" not in text and "base.toml" in text and field in text, text
