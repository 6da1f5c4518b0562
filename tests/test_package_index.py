"""Issue 40 B3: a second package index, named in the stack (uv's explicit indexes).

A local PEP 503 index on 127.0.0.1 serves a wheel with a local version label
(``tinyext-1.0+cu128``, whose URL spells the ``+`` as ``%2B``) and a ``six 99.0`` that stands
for a name PyPI also has (dependency confusion): only the distributions a stack maps to the
index may come from it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.http_helpers import serve_folder
from tests.spine_helpers import Result, frank

NAME = "tinyext"
VERSION = "1.0+cu128"
FILE = f"{NAME}-{VERSION}-py3-none-any.whl"
QUOTED = urllib.parse.quote(FILE)  # tinyext-1.0%2Bcu128-py3-none-any.whl


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal, valid pure-Python wheel (METADATA, WHEEL, RECORD), byte-reproducible."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
             f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}\n" for path, data in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(zipfile.ZipInfo(member, (1980, 1, 1, 0, 0, 0)), data)
    return path


@dataclass
class Index:
    """The served index: its simple URL, the tinyext wheel's sha256, and every path asked."""

    url: str
    sha256: str
    wheel: Path
    asked: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    wheels = {NAME: _wheel(files, NAME, VERSION, ("six",)), "six": _wheel(files, "six", "99.0"),
              "lonely": _wheel(files, "lonely", "1.0")}  # nothing asks for it
    for project, wheel in wheels.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        href = f"../../files/{urllib.parse.quote(wheel.name)}#sha256={sha}"
        page.write_text(f'<html><body><a href="{href}">{wheel.name}</a></body></html>\n')
    asked: list[str] = []

    with serve_folder(root, asked) as url:
        yield Index(f"{url}/simple", hashlib.sha256(wheels[NAME].read_bytes()).hexdigest(),
                    wheels[NAME], asked)


@pytest.fixture(autouse=True)
def _uv_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv (run by `frank lock`) keeps its cache under XDG_CACHE_HOME: a folder of this test
    session, never the user's, and fresh per test so an index page is always asked for."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))


PART = """kind = "package"
name = "tinyext"
version = "1"
summary = "a wheel from a second index, with a local version label"
status = "candidate"
distribution = "tinyext"

[wheel]
url = "{url}"
sha256 = "{sha256}"

[provenance]
credits = ["tests"]
licence = "Apache-2.0"

[revert]
action = "remove"
"""


def _stack(repo: Path, index: Index, body: str, name: str = "indexed") -> Path:
    """The tinyext part (pinned to the served file) and a stack over smoke-cpu adding it."""
    part = repo / "parts" / NAME / "1.toml"
    part.parent.mkdir(exist_ok=True)
    url = f"{index.url.removesuffix('/simple')}/files/{QUOTED}"
    part.write_text(PART.format(url=url, sha256=index.sha256))
    stack = repo / "stacks" / f"{name}.toml"
    stack.write_text(f'extends = "smoke-cpu.toml"\n{body}\n[add]\ntinyext = "1"\n')
    return stack


def _mapped(index: Index, *names: str) -> str:
    return (f'[indexes]\nlocal = "{index.url}"\n\n[from_index]\n'
            + "".join(f'{n} = "local"\n' for n in names))


def _pylock(repo: Path, name: str = "indexed") -> dict[str, dict[str, object]]:
    import tomllib

    doc = tomllib.loads((repo / "stacks" / f"pylock.{name}.toml").read_text())
    return {p["name"]: p for p in doc["packages"]}


def _one_line(result: Result) -> str:
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    return lines[0]


def test_lock_takes_a_mapped_distribution_from_its_index_and_check_accepts_the_url(
        repo: Path, index: Index) -> None:
    _stack(repo, index, _mapped(index, NAME, "six"))
    result = frank("lock", "indexed", cwd=repo)
    assert result.code == 0, result.err
    pkgs = _pylock(repo)
    wheel = pkgs[NAME]["wheels"][0]  # type: ignore[index]
    assert pkgs[NAME]["version"] == VERSION
    assert wheel["url"] == f"{index.url.removesuffix('/simple')}/files/{QUOTED}"
    assert wheel["hashes"]["sha256"] == index.sha256
    # six is on PyPI too: mapped to the index, the index's six (99.0) is the one taken
    assert pkgs["six"]["version"] == "99.0"
    assert str(pkgs["six"]["wheels"][0]["url"]).startswith(  # type: ignore[index]
        index.url.removesuffix("/simple"))
    # the lock records the index and what comes from it, and its digest covers them
    lock = json.loads((repo / "stacks" / "indexed.lock").read_text())
    assert lock["indexes"] == {"local": {"url": index.url, "distributions": ["six", NAME]}}
    # check accepts the %2B URL (its file name is the wheel's, unescaped) and the lock
    assert frank("check", cwd=repo).code == 0
    assert frank("lock", "--check", "indexed", cwd=repo).code == 0


def test_a_distribution_not_mapped_to_the_index_is_not_taken_from_it(
        repo: Path, index: Index) -> None:
    _stack(repo, index, _mapped(index, NAME))
    index.asked.clear()
    result = frank("lock", "indexed", cwd=repo)
    assert result.code == 0, result.err
    pkgs = _pylock(repo)
    assert str(pkgs[NAME]["wheels"][0]["url"]).startswith("http://127.0.0.1")  # type: ignore[index]
    # tinyext asks for six; the index has a six, but six is not mapped to it: PyPI's
    assert pkgs["six"]["version"] != "99.0"
    assert str(pkgs["six"]["wheels"][0]["url"]).startswith(  # type: ignore[index]
        "https://files.pythonhosted.org/")
    assert any(p.startswith("/simple/tinyext") for p in index.asked), index.asked
    assert not any("six" in p for p in index.asked), index.asked


def test_diff_shows_a_change_of_index(repo: Path, index: Index) -> None:
    _stack(repo, index, _mapped(index, NAME), name="indexed")
    # a child stack inherits the parent's index and maps one more distribution to it
    (repo / "stacks" / "indexed-six.toml").write_text(
        'extends = "indexed.toml"\n[from_index]\nsix = "local"\n')
    assert frank("lock", "indexed", "indexed-six", cwd=repo).code == 0
    result = frank("diff", "indexed", "indexed-six", "--json", cwd=repo)
    assert result.code == 0, result.err
    diff = json.loads(result.out)
    assert {"field": "indexes.local.distributions", "old": [NAME],
            "new": ["six", NAME]} in diff["config"], diff["config"]
    assert any(c["distribution"] == "six" and c["new"] == "99.0" for c in diff["closure"])
    table = frank("diff", "indexed", "indexed-six", cwd=repo)
    assert "indexes.local.distributions" in table.out


def test_pin_index_finds_a_wheel_whose_url_escapes_its_local_version(
        repo: Path, index: Index) -> None:
    _stack(repo, index, _mapped(index, NAME))
    manifest = repo / "parts" / NAME / "1.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace(index.sha256, "0" * 64).replace(QUOTED, "old.whl"))
    result = frank("pin", "tinyext@1", "--ref", VERSION, "--index", index.url, cwd=repo)
    assert result.code == 0, result.err
    assert manifest.read_text() == text  # the served URL (with %2B) and its sha256


def test_the_mirror_folder_serves_an_index_wheel(repo: Path, index: Index,
                                                  tmp_path: Path) -> None:
    """A build fetches the closure's wheels by sha256: store, mirror folder, then the URL
    (the index), so an air-gapped build takes the index's wheel from the mirror."""
    from frank.assemble.plan import closure_wheels
    from frank.resolve.lock import read_lock
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher, Pinned

    _stack(repo, index, _mapped(index, NAME, "six"))
    assert frank("lock", "indexed", cwd=repo).code == 0
    wheels = {w.name: w for w in closure_wheels(read_lock(repo / "stacks" / "indexed.lock"),
                                                 repo)}
    ext = wheels[NAME]
    assert ext.filename == FILE
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / ext.sha256).write_bytes(index.wheel.read_bytes())
    fetcher = Fetcher(BlobStore(tmp_path / "store"), [mirror])
    index.asked.clear()
    got = fetcher.fetch(Pinned(ext.url, ext.sha256, ext.size))
    assert got.read_bytes() == index.wheel.read_bytes()
    assert (fetcher.from_mirror, fetcher.downloaded) == (1, 0) and not index.asked
    # without a mirror the %2B URL itself is fetched from the index and verified
    direct = Fetcher(BlobStore(tmp_path / "store2"), [])
    assert direct.fetch(Pinned(ext.url, ext.sha256)).read_bytes() == index.wheel.read_bytes()
    assert direct.downloaded == 1 and any(QUOTED in p for p in index.asked), index.asked


@pytest.mark.parametrize(("body", "field", "says"), [
    ("", "from_index.tinyext", "tinyext, pinned by a part, is not on PyPI: declare the index"),
    ('[indexes]\nlocal = "{url}"\n\n[from_index]\ntinyext = "nope"\n',
     "from_index.tinyext", "'nope' is not an index of this stack"),
    ('[indexes]\nlocal = "ftp://127.0.0.1/simple"\n\n[from_index]\ntinyext = "local"\n',
     "indexes.local", "URL scheme should be 'http' or 'https'"),
    ('[indexes]\nlocal = "http://user:secret@127.0.0.1/simple"\n\n[from_index]\n'
     'tinyext = "local"\n', "indexes.local", "credentials"),
    ('[indexes]\nlocal = "{url}"\nother = "{url}"\n\n[from_index]\ntinyext = "local"\n',
     "indexes.other", "no distribution comes from it"),
    ('[indexes]\nlocal = "{url}"\n\n[from_index]\ntinyext = "local"\nTinyExt = "local"\n',
     "from_index.TinyExt", "the same distribution as 'tinyext'"),
    ('[indexes]\nlocal = "{url}"\n\n[from_index]\ntinyext = "local"\nlonely = "local"\n',
     "from_index.lonely", "not in the stack's Python closure"),
    ('[indexes]\nlocal = "{url}"\n\n[from_index]\ntinyext = "local"\nnumpy = "local"\n',
     "from_index.numpy", "index local ({url}) has no numpy"),
])
def test_an_undeclared_or_ill_formed_index_is_refused_in_one_line(
        repo: Path, index: Index, body: str, field: str, says: str) -> None:
    stack = _stack(repo, index, body.replace("{url}", index.url))
    line = _one_line(frank("lock", "indexed", cwd=repo))
    says = says.replace("{url}", index.url)
    assert str(stack.relative_to(repo)) in line and field in line and says in line, line


def test_an_override_of_a_mapped_distribution_comes_from_its_index(
        repo: Path, index: Index) -> None:
    """uv's --overrides drops a requirement's index source (PyPI's six has no 99.0): an
    override of a mapped distribution is the project's own override, which keeps it."""
    stack = _stack(repo, index, _mapped(index, NAME, "six"))
    part = repo / "parts" / "bump-six" / "1.toml"
    part.parent.mkdir()
    part.write_text('kind = "package"\nname = "bump-six"\nversion = "1"\nsummary = "six over"\n'
                    'status = "candidate"\ndistribution = "six"\noverrides = ["six==99.0"]\n'
                    + PART[PART.index("[provenance]"):])
    stack.write_text(stack.read_text() + 'bump-six = "1"\n')
    result = frank("lock", "indexed", cwd=repo)
    assert result.code == 0, result.err
    six = _pylock(repo)["six"]
    assert six["version"] == "99.0"
    assert str(six["wheels"][0]["url"]).startswith(  # type: ignore[index]
        index.url.removesuffix("/simple"))


@pytest.mark.parametrize(("field", "given", "near"), [
    ("remove", 'remove = ["sixx"]', "six"),
    ("overrides", 'overrides = ["sixx==1.16.0"]', "six"),
])
def test_a_removal_or_override_of_a_name_not_in_the_closure_is_refused(
        repo: Path, index: Index, field: str, given: str, near: str) -> None:
    """Issue 54 item 4 on the built-engine path: a name in remove or overrides that the
    closure does not hold (uv ignores both) is one line naming it and the closest real
    name; the right name locks."""
    stack = _stack(repo, index, _mapped(index, NAME))
    part = repo / "parts" / "six-change" / "1.toml"
    part.parent.mkdir()
    body = ('kind = "package"\nname = "six-change"\nversion = "1"\nsummary = "six"\n'
            'status = "candidate"\ndistribution = "six"\n{}\n' + PART[PART.index("[provenance]"):])
    part.write_text(body.format(given))
    stack.write_text(stack.read_text() + 'six-change = "1"\n')
    line = _one_line(frank("lock", "indexed", cwd=repo))
    assert "parts/six-change/1.toml" in line and f"{field}:" in line, line
    assert "sixx is not in the stack's Python closure" in line and f"closest is {near}" in line
    part.write_text(body.format(given.replace("sixx", "six")))
    assert frank("lock", "indexed", cwd=repo).code == 0
