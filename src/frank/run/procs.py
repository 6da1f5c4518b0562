"""Process-group bookkeeping for engines frank starts (trial runs, test servers)."""

from __future__ import annotations

import os
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group: the engine core and workers an
    engine leaves behind are found by group, never by name."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if os.getpgid(int(p.name)) == pgid:
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(p.name))
        except (ProcessLookupError, PermissionError, FileNotFoundError, IndexError):
            continue
    return out
