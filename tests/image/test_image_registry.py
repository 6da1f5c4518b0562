"""Push to Debian's docker-registry on loopback, pull back, compare digests; failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from frank.assemble.baselayout import BaseImage
from frank.cli import cli
from frank.errors import FrankError
from frank.image.oci import build_image
from frank.image.remote import pull_layout, push_layout, read_image
from frank.store.blobs import BlobStore
from tests.image.image_helpers import free_port, make_sources, make_spec
from tests.spine_helpers import audit_recorded

pytestmark = pytest.mark.slow


@pytest.fixture
def built(tmp_path: Path, mini_base: BaseImage, store: BlobStore) -> tuple[Path, str]:
    out = tmp_path / "out"
    return out, build_image(make_spec(mini_base, make_sources(tmp_path / "src")), store, out)


def test_push_pull_roundtrip(registry: str, built: tuple[Path, str], tmp_path: Path) -> None:
    layout, digest = built
    repo = f"{registry}/frank/demo"
    result = push_layout(layout, repo, ["demo", "lock-abc123"])
    assert result.digest == digest
    assert result.reference == f"{repo}@{digest}"
    assert pull_layout(repo, digest, tmp_path / "pulled") == digest
    # tags resolve to the same manifest, and its content reads back intact
    for tag in ("demo", "lock-abc123"):
        info = read_image(f"{repo}:{tag}")
        assert info.digest == digest
    info = read_image(f"{repo}@{digest}")
    assert info.labels == {"dev.frank.stack": "demo"}
    assert [x.digest for x in info.layers] == [x.digest for x in read_image(layout).layers]


def test_push_cli_refuses_an_image_of_no_stack_and_inspect_reads_it(
        registry: str, built: tuple[Path, str]) -> None:
    """`frank push` holds the image to its stack's lock in the repo (issue 53): a hand-made
    image of a stack the repo does not have is refused in one line, whatever audit.json
    says; `inspect` reads it and the registry's copy."""
    layout, digest = built
    runner = CliRunner()
    push = ["push", "--compression", "none", "stacks/demo.toml", "--to",
            f"{registry}/frank/cli", "--layout", str(layout)]
    audit_recorded(layout)  # a passed audit.json is no longer trusted
    r = runner.invoke(cli, push)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "stacks/demo.toml" in r.output
    push_layout(layout, f"{registry}/frank/cli", ["demo"])
    r = runner.invoke(cli, ["inspect", f"{registry}/frank/cli:demo", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["digest"] == digest
    r = runner.invoke(cli, ["inspect", str(layout)])
    assert r.exit_code == 0 and "part:kernel" in r.output


def test_registry_down_is_one_line(built: tuple[Path, str]) -> None:
    layout, _ = built
    with pytest.raises(FrankError) as exc:
        push_layout(layout, f"127.0.0.1:{free_port()}/frank/demo", ["x"])
    msg = exc.value.one_line()
    assert "\n" not in msg and "connection refused" in msg


def test_registry_refusing_is_one_line(readonly_registry: str, built: tuple[Path, str]) -> None:
    layout, _ = built
    with pytest.raises(FrankError) as exc:
        push_layout(layout, f"{readonly_registry}/frank/demo", ["x"])
    msg = exc.value.one_line()
    assert "\n" not in msg and msg.startswith("push to ")


def test_cli_error_is_one_line_exit_2(built: tuple[Path, str]) -> None:
    layout, _ = built
    r = CliRunner().invoke(cli, ["push", "demo", "--to", f"127.0.0.1:{free_port()}/x/y",
                                 "--layout", str(layout)])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("frank: error: ")


def test_bad_repository_refused(built: tuple[Path, str]) -> None:
    layout, _ = built
    for bad in ("noslash", "127.0.0.1:5000/x:tag", "127.0.0.1:5000/x@sha256:" + "0" * 64):
        with pytest.raises(FrankError, match="not a repository"):
            push_layout(layout, bad)


def test_missing_remote_image(registry: str) -> None:
    with pytest.raises(FrankError, match="cannot read"):
        read_image(f"{registry}/frank/none:nope")


def test_a_registry_that_asks_for_a_login_is_one_line_naming_it(
        built: tuple[Path, str], tmp_path: Path) -> None:
    """Debian's packaged docker-registry config: htpasswd logins it cannot check; a push
    got a bare 400 whose cause was only in the registry's log."""
    from tests.image.conftest import start_registry, stop

    proc, host = start_registry(tmp_path / "auth", auth=True)
    try:
        layout, _ = built
        with pytest.raises(FrankError) as exc:
            push_layout(layout, f"{host}/x/y", ["x"])
        msg = exc.value.one_line()
        assert "\n" not in msg and msg.startswith(f"push to {host}/x/y")
        assert "asks for htpasswd logins it cannot check" in msg
    finally:
        stop(proc)
