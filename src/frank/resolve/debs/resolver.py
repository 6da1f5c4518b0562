"""The closure of a ``[debs]`` recipe: Depends and Pre-Depends followed, as apt would.

For each or-group the first alternative already chosen wins, else the first that the
indexes can satisfy; a virtual package goes to a chosen provider, else the provider of
highest Priority (then name), so the answer is the same every time for the same indexes.
Across suites the newest version that meets the constraint is taken (bookworm-security
over bookworm). Recommends are not followed and no Essential package is added unasked:
the base holds exactly what the recipe names and what that needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from debian.deb822 import PkgRelation
from debian.debian_support import Version

from frank.errors import FrankError
from frank.model.imagefile import DebsSource
from frank.resolve.debs.archive import Index, read_index
from frank.resolve.debs.lock import DebsLock, LockedDeb
from frank.store.fetch import Fetcher

_PRIORITY = {"required": 0, "important": 1, "standard": 2, "optional": 3, "extra": 4}
_OPS: dict[str, Callable[[int], bool]] = {
    "<<": lambda c: c < 0, "<=": lambda c: c <= 0, "=": lambda c: c == 0,
    ">=": lambda c: c >= 0, ">>": lambda c: c > 0,
}
if TYPE_CHECKING:
    Relation = PkgRelation.ParsedRelation  # name, version (op, ver) or None, archqual, ...


@dataclass(frozen=True)
class Candidate:
    """One binary package version available from one suite."""

    name: str
    version: Version
    archive: str
    suite: str
    fields: dict[str, str]
    provides: tuple[tuple[str, Version | None], ...]

    @property
    def priority(self) -> int:
        return _PRIORITY.get(self.fields.get("Priority", "optional"), 3)

    def depends(self) -> list[list[Relation]]:
        """Pre-Depends then Depends, parsed only for packages chosen (parsing all is slow)."""
        return [group for key in ("Pre-Depends", "Depends") if key in self.fields
                for group in PkgRelation.parse_relations(self.fields[key])]


def _satisfies(version: Version | None, constraint: tuple[str, str] | None) -> bool:
    if constraint is None:
        return True
    if version is None:  # an unversioned Provides never meets a versioned Depends
        return False
    op, want = constraint
    other = Version(want)
    return _OPS[op]((version > other) - (version < other))


@dataclass
class Universe:
    """Every candidate of the recipe's suites, by name and by what they provide."""

    real: dict[str, list[Candidate]] = field(default_factory=dict)
    virtual: dict[str, list[tuple[Candidate, Version | None]]] = field(default_factory=dict)

    def add(self, index: Index) -> None:
        for p in index.packages:
            rel = PkgRelation.parse_relations(p["Provides"]) if "Provides" in p else []
            provides = tuple((r["name"], Version(r["version"][1]) if r["version"] else None)
                             for group in rel for r in group)
            c = Candidate(name=p["Package"], version=Version(p["Version"]),
                          archive=index.archive, suite=index.suite, fields=dict(p),
                          provides=provides)
            self.real.setdefault(c.name, []).append(c)
            for name, ver in provides:
                self.virtual.setdefault(name, []).append((c, ver))

    def best(self, name: str, constraint: tuple[str, str] | None) -> Candidate | None:
        """The newest real package meeting the constraint, else the preferred provider."""
        real = [c for c in self.real.get(name, []) if _satisfies(c.version, constraint)]
        if real:
            return max(real, key=lambda c: c.version)
        providers = [c for c, v in self.virtual.get(name, []) if _satisfies(v, constraint)]
        if not providers:
            return None
        top = min(providers, key=lambda c: (c.priority, c.name))
        return max((c for c in providers if c.name == top.name), key=lambda c: c.version)


def _met(rel: Relation, chosen: dict[str, Candidate]) -> bool:
    c = chosen.get(rel["name"])
    if c is not None and _satisfies(c.version, rel["version"]):
        return True
    return any(name == rel["name"] and _satisfies(ver, rel["version"])
               for c in chosen.values() for name, ver in c.provides)


def _show(group: list[Relation]) -> str:
    def one(r: Relation) -> str:
        v = r["version"]
        return r["name"] + (f" ({v[0]} {v[1]})" if v else "")
    return " | ".join(one(r) for r in group)


def closure(src: DebsSource, universe: Universe, *, file: Path) -> list[Candidate]:
    """Every package the recipe needs, sorted by name."""
    chosen: dict[str, Candidate] = {}
    queue: deque[Candidate] = deque()

    def choose(c: Candidate, why: str) -> None:
        old = chosen.get(c.name)
        if old is not None:
            if old.version != c.version:
                raise FrankError(f"{c.name} is needed at {old.version} and at {c.version} "
                                 f"({why})", file=file, field="debs.packages")
            return
        chosen[c.name] = c
        queue.append(c)

    for name in sorted(src.packages):
        c = universe.best(name, None)
        if c is None:
            raise FrankError(f"no package {name!r} in {src.suite} ({src.arch})", file=file,
                             field="debs.packages")
        choose(c, "asked for")
    while queue:
        pkg = queue.popleft()
        for group in pkg.depends():
            if any(_met(r, chosen) for r in group):
                continue
            pick = next((c for r in group
                         if (c := universe.best(r["name"], r["version"])) is not None), None)
            if pick is None:
                raise FrankError(f"nothing satisfies '{_show(group)}' (needed by {pkg.name} "
                                 f"{pkg.version})", file=file, field="debs.packages")
            choose(pick, f"needed by {pkg.name}")
    return [chosen[k] for k in sorted(chosen)]


def archive_roots(src: DebsSource) -> dict[str, str]:
    """The archive URLs this machine reads from: the recipe's, else apt's configuration."""
    from frank.resolve.debs.archive import apt_mirror

    return {"debian": (src.archive or apt_mirror()).rstrip("/"),
            "debian-security": (src.security_archive or apt_mirror(security=True)).rstrip("/")}


def resolve_lock(src: DebsSource, fetcher: Fetcher, *, file: Path) -> DebsLock:
    """Read the recipe's signed indexes and pin its closure (needs the network)."""
    roots = archive_roots(src)
    universe = Universe()
    records = []
    for archive, suite in src.suites():
        for component in src.components:
            index = read_index(roots[archive], archive, suite, component, src, fetcher,
                               file=file)
            universe.add(index)
            records.append(index.record)
    pkgs = [LockedDeb(name=c.name, version=str(c.version), arch=c.fields["Architecture"],
                      archive=c.archive, suite=c.suite,
                      filename=c.fields["Filename"], size=int(c.fields["Size"]),
                      sha256=c.fields["SHA256"])
            for c in closure(src, universe, file=file)]
    return DebsLock(recipe=src.content(), indexes=records, packages=pkgs)
