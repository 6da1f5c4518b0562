"""The part catalogue: every manifest under ``parts/<name>/<version>.toml``, validated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from frank.errors import FrankError
from frank.fsutil import inside_repo
from frank.hashing import sha256_file
from frank.model.kinds import PART_ADAPTER
from frank.model.tomlio import read_toml, validation_to_error

if TYPE_CHECKING:
    from frank.model.kinds import AnyPart


@dataclass(frozen=True)
class Manifest:
    """A validated part and the file it came from."""

    part: AnyPart
    path: Path  # absolute
    rel: str  # repo-relative POSIX path

    @property
    def sha256(self) -> str:
        """Hash of the manifest file's bytes (comments included)."""
        return sha256_file(self.path)


def load_manifest(path: Path, root: Path) -> Manifest:
    """Parse and validate one manifest; its name and version must match its path, which
    links may not take out of the repo (``pin`` edits it, its paths are the repo's)."""
    inside_repo(root, path, file=path, field="parts")
    raw = read_toml(path)
    try:
        part = PART_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise validation_to_error(exc, path, tag=str(raw.get("kind"))) from None
    if part.name != path.parent.name:
        raise FrankError(f"{part.name!r} must match its folder {path.parent.name!r}",
                         file=path, field="name")
    if part.version != path.stem:
        raise FrankError(f"{part.version!r} must match its file name {path.stem!r}",
                         file=path, field="version")
    return Manifest(part=part, path=path, rel=path.relative_to(root).as_posix())


class Catalog:
    """Manifests by (name, version), loaded lazily from the repo's parts/ folder."""

    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[tuple[str, str], Manifest] = {}

    def manifest_path(self, name: str, version: str) -> Path:
        """Where the manifest of ``name`` at ``version`` lives."""
        return self.root / "parts" / name / f"{version}.toml"

    def get(self, name: str, version: str, *, file: Path, field: str) -> Manifest:
        """One manifest; an unknown part or version is an error naming the stack field."""
        key = (name, version)
        if key not in self._cache:
            path = self.manifest_path(name, version)
            if not path.is_file():
                known = self.versions(name)
                hint = f" (known versions: {', '.join(known)})" if known else " (unknown part)"
                raise FrankError(f"no manifest parts/{name}/{version}.toml{hint}",
                                 file=file, field=field)
            self._cache[key] = load_manifest(path, self.root)
        return self._cache[key]

    def versions(self, name: str) -> list[str]:
        """Versions of a part that have manifests."""
        folder = self.root / "parts" / name
        return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []

    def all(self) -> list[Manifest]:
        """Every manifest in the repo, validated, sorted by path."""
        out = []
        for path in sorted((self.root / "parts").glob("*/*.toml")):
            key = (path.parent.name, path.stem)
            if key not in self._cache:
                self._cache[key] = load_manifest(path, self.root)
            out.append(self._cache[key])
        return out
