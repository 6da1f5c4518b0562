"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spine_helpers import copy_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A private copy of the repo's parts/stacks/images/sources to change freely."""
    return copy_repo(tmp_path / "repo")
