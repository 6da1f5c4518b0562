"""Issue 54 item 2: a patch applies every file or the build fails naming those it cannot
place. Files under the engine's packages are patched; a new file outside them goes where the
part's ``[destinations]`` puts its top-level folder; a changed file outside them, or a new one
without a destination, fails in one line naming it (before, "67 files of 77" was applied and
the rest only logged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frank.assemble.patching import apply_to_files
from frank.errors import FrankError

ORIGINAL = {"pkg/serve.py": b"GREETING = 'hello'\n"}
INSIDE = ("--- a/pkg/serve.py\n+++ b/pkg/serve.py\n"
          "@@ -1 +1 @@\n-GREETING = 'hello'\n+GREETING = 'patched'\n")
NEW_TOOL = ("--- /dev/null\n+++ b/tools/probe/run.py\n"
            "@@ -0,0 +1,2 @@\n+print('probe')\n+print('done')\n")
NEW_CU = "--- /dev/null\n+++ b/csrc/k.cu\n@@ -0,0 +1 @@\n+// kernel\n"
CHANGED_OUTSIDE = "--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def _apply(tmp_path: Path, text: str, destinations: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return apply_to_files(text, {"pkg"}, lambda paths: {p: ORIGINAL[p] for p in paths
                                                         if p in ORIGINAL},
                          tmp_path / "image/site", label="patch:fix", log=tmp_path / "log",
                          what="pkg-1.0.whl", destinations=destinations,
                          image_root=tmp_path / "image")


def test_new_files_outside_the_package_land_at_their_destinations(tmp_path: Path) -> None:
    result = _apply(tmp_path, INSIDE + NEW_TOOL + NEW_CU,
                    {"tools": "/usr/local/lib/python3.11/dist-packages/tools",
                     "csrc": "/opt/frank/src/fix/csrc"})
    assert result.changed == ["pkg/serve.py"]
    assert result.placed == ["/opt/frank/src/fix/csrc/k.cu",
                             "/usr/local/lib/python3.11/dist-packages/tools/probe/run.py"]
    image = tmp_path / "image"
    assert (image / "site/pkg/serve.py").read_text() == "GREETING = 'patched'\n"
    assert (image / "usr/local/lib/python3.11/dist-packages/tools/probe/run.py").read_text() \
        == "print('probe')\nprint('done')\n"
    assert (image / "opt/frank/src/fix/csrc/k.cu").read_text() == "// kernel\n"
    assert "1 files of 3 in the packages, 2 placed outside" in (tmp_path / "log").read_text()


@pytest.mark.parametrize(("text", "destinations", "named"), [
    (INSIDE + NEW_TOOL + NEW_CU, {"tools": "/opt/t"}, "csrc/k.cu"),  # no destination
    (INSIDE + NEW_TOOL, None, "tools/probe/run.py"),
    (INSIDE + CHANGED_OUTSIDE, {"setup.py": "/opt/s"}, "setup.py"),  # changed: no original
])
def test_a_file_the_patch_cannot_place_fails_naming_it(tmp_path: Path, text: str,
                                                       destinations: dict[str, str] | None,
                                                       named: str) -> None:
    with pytest.raises(FrankError) as info:
        _apply(tmp_path, text, destinations)
    line = info.value.one_line()
    assert "cannot place" in line and named in line and line.startswith("patch:fix"), line
    assert not (tmp_path / "image/site/pkg/serve.py").exists()  # nothing applied in part


def test_a_destination_that_places_nothing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FrankError, match=r"destinations\.tests places no file"):
        _apply(tmp_path, INSIDE + NEW_TOOL, {"tools": "/opt/t", "tests": "/opt/x"})
