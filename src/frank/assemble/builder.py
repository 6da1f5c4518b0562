"""Hand a build plan to an image builder: the embedded OCI writer or a container engine.

``auto`` uses the embedded, daemonless builder whenever no layer needs a command run
inside the image; otherwise the first container engine found (buildah, podman, docker),
building the Dockerfile context compose wrote. Either way the result is an OCI layout.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from frank.assemble.context import stage_layer
from frank.assemble.plan import BuildPlan, PlanLayer
from frank.errors import FrankError
from frank.hashing import sha256_json

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from frank.assemble.layerpool import Tap
    from frank.assemble.pipeline import Built
    from frank.image.spec import LayerInput
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher

Builder = Literal["auto", "oci", "buildah", "podman", "docker"]
OCI_BUILDER_VERSION = 2


@dataclass(frozen=True)
class BuildResult:
    """What was built, by which builder, and why that one."""

    digest: str
    layout: Path
    builder: str
    why: str
    layers_built: int
    layers_reused: int
    # blob digest -> what the caller's tap read of it as it was written (``layerpool``)
    tapped: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def choose_builder(plan: BuildPlan, requested: Builder) -> tuple[str, str]:
    """(builder, why) for the plan; a request the plan cannot honour is an error."""
    from frank.assemble.engines import detect

    running = [layer.name for layer in plan.layers if layer.run or layer.stage]
    if requested == "oci":
        if running:
            raise FrankError(f"the embedded builder cannot run commands, and {running[0]} "
                             "needs some; use --builder auto, buildah, podman or docker",
                             field="--builder")
        return "oci", "requested"
    if requested == "auto" and not running:
        return "oci", "no layer runs a command: embedded daemonless builder"
    engines = detect()
    if requested != "auto":
        if not any(e.name == requested for e in engines):
            raise FrankError(f"{requested} is not available here (install it, e.g. "
                             f"apt-get install {requested})", field="--builder")
        return requested, "requested"
    if not engines:
        raise FrankError(f"{running[0]} runs commands inside the image and no container "
                         "engine was found: install buildah (apt-get install buildah) or "
                         "podman, or run a Docker daemon", field="--builder")
    return engines[0].name, f"{running[0]} runs commands inside the image; " \
                            f"{engines[0].name} is the first engine found"


def build_oci(plan: BuildPlan, root: Path, out: Path, *, log: Path,
              mirrors: tuple[Path, ...] = (), quiet: bool = False,
              tap: Callable[[], Tap] | None = None) -> BuildResult:
    """Build with the embedded writer: the missing layers made on the host (``pipeline``:
    downloads in flight while layers of wheels are streamed into their blobs, the others
    staged), then the image and its layout.

    Nothing runs inside the image. Every input is verified as it enters the store, before a
    layer reads it; a layer whose key the index knows is reused without reading anything.
    """
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rich.console import Console

    from frank.assemble.base import resolve_base
    from frank.assemble.baselayout import BaseImage
    from frank.image.oci import build_image
    from frank.image.spec import ImageSpec
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher

    console = Console(stderr=True, quiet=quiet)
    store = BlobStore()
    fetcher = Fetcher(store, mirrors)
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"frank embedded build of {plan.stack} ({plan.lock_digest})\n")
    log_lock = threading.Lock()

    def note(line: str) -> None:
        with log_lock:
            _log(log, line)

    def base_made() -> BaseImage:
        made = resolve_base(root / "images" / f"{plan.base_image['name']}.toml", store,
                            quiet=True)  # beside the download bar: its line is in the log
        note(f"base {plan.base_image['name']}: ready at {time.monotonic() - start:.1f} s")
        return made

    # the base (its .debs fetched and unpacked on a cold machine: 4.6 s of served's cold
    # build) is wanted only by the image at the end: it is made while the layers are
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="frank-base") as side:
        base_future = side.submit(base_made)
        fresh, reused, layers, built, tapped = _layers(plan, root, store, fetcher, console,
                                                       log, note, start, tap)
        base = base_future.result()
    spec = ImageSpec(
        base_layout=base.layout, base_digest=base.digest, layers=tuple(layers),
        env=plan.config.env, entrypoint=plan.config.entrypoint, cmd=plan.config.cmd,
        labels=plan.config.labels,
        annotations={"dev.frank.lock.digest": plan.lock_digest, "dev.frank.stack": plan.stack},
        source_date_epoch=plan.source_date_epoch,
    )
    digest = build_image(spec, store, out, ref_name=plan.stack, quiet=quiet, fresh=fresh)
    _log(log, f"image {digest}: {built} layers built, {reused} reused; "
              f"{time.monotonic() - start:.1f} s")
    return BuildResult(digest=digest, layout=out, builder="oci", why="", layers_built=built,
                       layers_reused=reused, tapped=tapped)


def _layers(plan: BuildPlan, root: Path, store: BlobStore, fetcher: Fetcher,
            console: Console, log: Path, note: Callable[[str], None], start: float,
            tap: Callable[[], Tap] | None = None
            ) -> tuple[set[str], int, list[LayerInput], int, dict[str, Any]]:
    """Every layer's spec, the missing ones made: (fresh blob digests, layers reused,
    specs, layers built, what the tap read of each streamed blob)."""
    import time

    from frank.image.layer import build_layer, index_key, indexed
    from frank.image.spec import LayerInput

    reused = 0
    layers: list[LayerInput] = []
    missing: list[tuple[PlanLayer, LayerInput]] = []
    for layer in plan.layers:
        key = sha256_json({"plan_layer": layer.key, "builder": OCI_BUILDER_VERSION})
        spec_layer = LayerInput(name=layer.name, key=key, entries=((store.tmp_dir, "/"),))
        if indexed(store, index_key(spec_layer, plan.source_date_epoch)) is None:
            missing.append((layer, spec_layer))
        else:
            reused += 1
        layers.append(spec_layer)

    def stage(layer: PlanLayer, spec_layer: LayerInput) -> str:
        """One layer the staging way: assembled in a temp tree, then tarred."""
        began = time.monotonic()
        with tempfile.TemporaryDirectory(dir=store.tmp_dir, prefix="stage-") as tmp:
            staging = Path(tmp)
            assemble_layer(layer, plan, root, staging, fetcher, log)
            rec, _ = build_layer(store, LayerInput(name=layer.name, key=spec_layer.key,
                                                   entries=((staging, "/"),)),
                                 plan.source_date_epoch)
        note(f"layer {layer.index} {layer.name}: built (staged) in "
             f"{time.monotonic() - began:.1f} s, at {time.monotonic() - start:.1f} s")
        return rec.digest

    if not missing:
        return set(), reused, layers, 0, {}
    made = _make_missing(missing, plan, fetcher, console, stage, note, start, tap)
    return made.fresh, reused, layers, len(missing), made.tapped


def _make_missing(missing: list[tuple[PlanLayer, LayerInput]], plan: BuildPlan,
                  fetcher: Fetcher, console: Console,
                  stage: Callable[[PlanLayer, LayerInput], str],
                  note: Callable[[str], None], since: float,
                  tap: Callable[[], Tap] | None = None) -> Built:
    """Fetch and make the missing layers (``pipeline``), with a download bar."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from frank.assemble.pipeline import build_missing
    from frank.store.fetch import Pinned

    # patches first, on their own: one that cannot be had fails before gigabytes of wheels
    fetcher.fetch_all([Pinned(x.patch.source, x.patch.sha256) for x, _ in missing
                       if x.patch and "://" in x.patch.source]
                      + [Pinned(f.url, f.sha256) for x, _ in missing for f in x.fetched])
    store = fetcher.store
    with Progress(TextColumn(f"{len(missing)} layers: fetching and writing"), BarColumn(),
                  DownloadColumn(), console=console, transient=True) as bar:
        todo = {w.sha256: w.size or 0 for x, _ in missing for w in x.wheels
                if not store.has("sha256:" + w.sha256)}
        task = bar.add_task("fetch", total=sum(todo.values()) or None)
        made = build_missing(
            missing, site=plan.site_packages, epoch=plan.source_date_epoch, fetcher=fetcher,
            stage=stage, note=note, progress=lambda i: bar.advance(task, todo.get(i.sha256, 0)),
            since=since, tap=tap)
    return made


def _log(log: Path, line: str) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")


def _fetch_inputs(layers: list[PlanLayer], fetcher: Fetcher, console: Console,
                  log: Path) -> None:
    """Download every wheel and patch the missing layers need, in parallel, verified."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from frank.store.fetch import Pinned

    # small pinned files first, on their own: a patch URL that cannot be had fails before
    # gigabytes of wheels are downloaded
    patches = [Pinned(layer.patch.source, layer.patch.sha256) for layer in layers
               if layer.patch and "://" in layer.patch.source]
    patches += [Pinned(f.url, f.sha256) for layer in layers for f in layer.fetched]
    fetcher.fetch_all(patches)
    items = [Pinned(w.url, w.sha256, w.size) for layer in layers for w in layer.wheels]
    items += [Pinned(layer.patch.engine_wheel.url, layer.patch.engine_wheel.sha256,
                     layer.patch.engine_wheel.size) for layer in layers
              if layer.patch and layer.patch.engine_wheel]
    todo = [i for i in items if not fetcher.store.has(i.digest)]
    if todo:
        total = sum(i.size or 0 for i in todo)
        with Progress(TextColumn("fetching {task.fields[n]} files"), BarColumn(),
                      DownloadColumn(), console=console, transient=True) as bar:
            task = bar.add_task("fetch", total=total or None, n=len(todo))
            fetcher.fetch_all(todo, progress=lambda i: bar.advance(task, i.size or 0))
    _log(log, f"inputs: {len(items) + len(patches)} needed, {fetcher.downloaded} downloaded, "
              f"{fetcher.from_mirror} from a mirror, the rest already in the store")


def assemble_layer(layer: PlanLayer, plan: BuildPlan, root: Path, staging: Path,
                   fetcher: Fetcher, log: Path) -> None:
    """Fill ``staging`` with the layer's files: copies, wheels, patched files, kernels."""
    from frank.assemble.install import install_wheels
    from frank.store.fetch import Pinned

    site = plan.site_packages
    stage_layer(layer, root, staging)
    for item in layer.fetched:  # fetched here, on the host, verified: never in the image
        from frank.assemble.context import image_path_under

        dest = image_path_under(staging, item.dest, layer.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fetcher.fetch(Pinned(item.url, item.sha256)), dest)
    if layer.wheels:
        paths = [(w.filename, fetcher.fetch(Pinned(w.url, w.sha256, w.size)))
                 for w in layer.wheels]
        install_wheels(paths, staging, site)
    if layer.patch is not None:
        _apply_patch(layer, plan, root, staging, fetcher, log)
    if layer.base_remove:
        from frank.assemble.base import plan_inventory, whiteouts

        assert plan.base_python is not None
        _, _, inventory = plan_inventory(
            plan.base_python, root / "images" / f"{plan.base_image['name']}.toml",
            fetcher.store)
        gone = whiteouts(inventory, layer.base_remove, staging)
        _log(log, f"layer {layer.index}: {', '.join(layer.base_remove)} of the engine image "
                  f"taken out ({len(gone)} whiteouts)")
    sources = [root / folder for folder in layer.build_wheels]
    if layer.aot is not None:
        _build_aot(layer, plan, root, staging, fetcher, log)
    if layer.extension is not None:
        _build_extension(layer, plan, root, staging, fetcher, log)
    if layer.kernel is not None:
        tree, source = _compile_kernel(layer, root, staging, fetcher)
        # the plugin package is built from the compiled tree, which holds the libraries
        sources = [tree / Path(folder).relative_to(source) for folder in layer.build_wheels]
    if sources:
        from frank.assemble.wheel import build_wheel

        with tempfile.TemporaryDirectory(dir=fetcher.store.tmp_dir, prefix="wheel-") as tmp:
            wheels = []
            for folder in sources:
                wheel = build_wheel(folder, Path(tmp))
                _log(log, f"layer {layer.index}: built {wheel.name} from {folder}")
                wheels.append((wheel.name, wheel))
            install_wheels(wheels, staging, site)


def _apply_patch(layer: PlanLayer, plan: BuildPlan, root: Path, staging: Path,
                 fetcher: Fetcher, log: Path) -> None:
    from frank.assemble.patching import apply_to_wheel
    from frank.model.kinds.patch import touches_compiled
    from frank.store.fetch import Pinned

    step = layer.patch
    site = plan.site_packages
    assert step is not None
    if "://" in step.source:
        text = fetcher.fetch(Pinned(step.source, step.sha256)).read_text(encoding="utf-8")
    else:
        text = (root / step.source).read_text(encoding="utf-8")
    if touches_compiled(text) != step.declared_compiled:
        raise FrankError(f"declared {step.declared_compiled} but the diff "
                         f"{'touches' if not step.declared_compiled else 'does not touch'} "
                         "compiled code", file=root / step.manifest, field="touches_compiled")
    if step.engine_wheel is None:  # the official engine image's own files
        from frank.assemble.base import patch_base_engine

        assert plan.base_python is not None and step.base_dist is not None
        result = patch_base_engine(
            text, step.base_dist, plan.base_python,
            root / "images" / f"{plan.base_image['name']}.toml", fetcher.store,
            staging / site.lstrip("/"), label=layer.name, log=log,
            destinations=step.destinations, image_root=staging)
    else:
        wheel = fetcher.fetch(Pinned(step.engine_wheel.url, step.engine_wheel.sha256))
        result = apply_to_wheel(text, wheel, staging / site.lstrip("/"), label=layer.name,
                                log=log, destinations=step.destinations, image_root=staging)
    _log(log, f"layer {layer.index}: {step.part}: {len(result.changed)} files changed, "
              f"{len(result.deleted)} deleted, {len(result.placed)} new files placed outside "
              f"the engine's packages: {', '.join(result.placed) or 'none'}")


def _compile_kernel(layer: PlanLayer, root: Path, staging: Path, fetcher: Fetcher
                    ) -> tuple[Path, str]:
    """Compile the kernel on the host; its libraries go to /opt/frank/kernels/<name>.

    Returns the built tree and the kernel's source folder (repo-relative) it mirrors.
    """
    from frank.assemble.kernel import compile_kernel
    from frank.model.kinds.kernel import Kernel, kernel_dest

    part = Kernel.model_validate(layer.kernel)
    assert part.source is not None and layer.manifest is not None
    tree = compile_kernel(part, root, root / layer.manifest, fetcher)
    dest = staging / kernel_dest(part.name).lstrip("/")
    dest.mkdir(parents=True, exist_ok=True)
    for lib in sorted(tree.rglob("*.so")):
        if not (dest / lib.name).exists():
            shutil.copyfile(lib, dest / lib.name)
    return tree, part.source


def _build_aot(layer: PlanLayer, plan: BuildPlan, root: Path, staging: Path,
               fetcher: Fetcher, log: Path) -> None:
    """An aot part's modules, built on the host (or kept by key), placed at
    ``<site-packages>/<dest>/<name>/<name>.so``. They are built from the library's wheel the
    part pins, which must be the one the closure installs."""
    from packaging.utils import canonicalize_name

    from frank.assemble.aot import build_modules
    from frank.model.kinds.aot import Aot

    part = Aot.model_validate(layer.aot)
    assert part.wheel is not None and layer.manifest is not None
    manifest = root / layer.manifest
    want = canonicalize_name(part.distribution)
    installed = [w for x in plan.layers for w in x.wheels if canonicalize_name(w.name) == want]
    if not any(w.sha256 == part.wheel.sha256 for w in installed):
        have = ", ".join(f"{w.filename} ({w.sha256[:12]})" for w in installed) or "none"
        raise FrankError(f"the modules would be built from {part.wheel.sha256[:12]}, but the "
                         f"closure installs {have} for {part.distribution}",
                         file=manifest, field="wheel")
    paths = build_modules(part, root, manifest, fetcher)
    dest = staging / plan.site_packages.strip("/") / part.dest
    for name, path in sorted(paths.items()):
        target = dest / name / f"{name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        target.chmod(0o644)
    _log(log, f"layer {layer.index}: {len(paths)} {part.distribution} modules "
              f"({', '.join(sorted(paths))}) at {part.dest}")


def _build_extension(layer: PlanLayer, plan: BuildPlan, root: Path, staging: Path,
                     fetcher: Fetcher, log: Path) -> None:
    """An extension part's module, built on the host (or kept by key), placed at the top of
    ``<site-packages>``. Its sources, and the headers of any distribution the closure
    installs, must be the files the closure installs; its Python, the image's."""
    from packaging.utils import canonicalize_name

    from frank.assemble.extension import build_extension
    from frank.model.kinds.extension import Extension, python_version
    from frank.model.pins import wheel_filename

    part = Extension.model_validate(layer.extension)
    assert part.wheel is not None and layer.manifest is not None
    manifest = root / layer.manifest
    installed: dict[str, list[str]] = {}
    for x in plan.layers:
        for w in x.wheels:
            installed.setdefault(str(canonicalize_name(w.name)), []).append(w.sha256)
    pinned = [("wheel", part.distribution, part.wheel.sha256)] + [
        ("headers", wheel_filename(str(w.url)).split("-", 1)[0], w.sha256)
        for w in part.headers]
    for where, dist, sha in pinned:
        have = installed.get(str(canonicalize_name(dist))) or []
        if (where == "wheel" or have) and sha not in have:
            raise FrankError(f"{part.module} would be built from {dist} {sha[:12]}, but the "
                             f"closure installs {', '.join(h[:12] for h in have) or 'none'}",
                             file=manifest, field=where)
    version = python_version(part.python_headers)
    if f"/python{version}/" not in f"{plan.site_packages}/":
        raise FrankError(f"the headers are CPython {version}'s, but the image's site folder "
                         f"is {plan.site_packages}", file=manifest, field="python_headers")
    built = build_extension(part, root, fetcher, manifest=manifest)
    target = staging / plan.site_packages.strip("/") / built.module.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built.module, target)
    target.chmod(0o644)
    _log(log, f"layer {layer.index}: {built.module.name} (sha256 {built.result['sha256']}, "
              f"key {built.folder.name[:16]}) at the top of the site folder")


def stage_host_layers(plan: BuildPlan, root: Path, context: Path, *, log: Path,
                      store_root: Path, mirrors: tuple[Path, ...] = (),
                      mounts: bool = True) -> frozenset[int]:
    """Assemble the host-built layers into the context, so any container engine builds it,
    and the kept outputs of builder stages whose key an earlier build had (``stepcache``);
    returns the indexes of those stages, which are not run again. Without ``mounts`` the
    Dockerfile is written again with no build secrets (``render_dockerfile``).

    The same assembly as the embedded builder's (same fetched inputs, same trees); only the
    tar and the image config are then the engine's.
    """
    from rich.console import Console

    from frank.assemble import stepcache
    from frank.assemble.context import (
        checked_out,
        host_built,
        layer_dir,
        render_dockerfile,
        template_text,
    )
    from frank.store.fetch import Fetcher

    def rootfs_of(layer: PlanLayer) -> Path:
        return context / "layers" / layer_dir(layer) / "rootfs"

    reused: set[int] = set()
    for layer in plan.layers:
        kept = stepcache.cached(store_root, layer) if layer.stage else None
        if kept is not None:
            stepcache.place(kept, context / "layers" / layer_dir(layer) / "outputs")
            reused.add(layer.index)
    host = [x for x in plan.layers if host_built(x)]
    sources = [x for x in plan.layers if checked_out(x) and x.index not in reused]
    if not host and not sources and not reused and mounts:
        return frozenset()
    for layer in sources:  # first: an unreachable source stops before gigabytes of wheels
        _check_out_source(layer, root, rootfs_of(layer), log, store_root)
    fetcher = Fetcher(mirrors=mirrors)
    _fetch_inputs(host, fetcher, Console(stderr=True), log)
    staged = set()
    for layer in plan.layers:
        rootfs = rootfs_of(layer)
        if layer in host:
            shutil.rmtree(rootfs, ignore_errors=True)
            rootfs.mkdir(parents=True)
            assemble_layer(layer, plan, root, rootfs, fetcher, log)
        if rootfs.is_dir():
            staged.add(layer.index)
    (context / "Dockerfile").write_text(render_dockerfile(plan, staged, template_text(root),
                                                          frozenset(reused), mounts))
    return frozenset(reused)


def _check_out_source(layer: PlanLayer, root: Path, rootfs: Path, log: Path,
                      store_root: Path) -> None:
    """A source-built layer's git source, checked out on the host into its stage's inputs."""
    from frank.assemble.context import image_path_under
    from frank.store import gitsource

    assert layer.stage is not None and layer.stage.source is not None
    src = layer.stage.source
    dest = image_path_under(rootfs, src.dest, layer.name)
    shutil.rmtree(dest, ignore_errors=True)
    gitsource.checkout(src.repo, src.commit, src.submodules, dest, root=root,
                       cache=store_root, log=log)


def network_layers(plan: BuildPlan, reused: frozenset[int] = frozenset()) -> list[str]:
    """The layers for which a container build of ``plan`` must reach the network: those that
    run in the container (not one frank assembles on the host and stages, nor a stage whose
    kept outputs are reused) and declare they do (a source build's apt-get and pip; pip from
    an index; a patch fetched by URL). A post-install step or a kernel compiled in the image
    never does: it runs offline."""
    from frank.assemble.context import host_built

    return [layer.name for layer in plan.layers
            if layer.network and not host_built(layer) and layer.index not in reused]


def needs_network(plan: BuildPlan, reused: frozenset[int] = frozenset()) -> bool:
    """Whether some layer of a container build of ``plan`` needs the network."""
    return bool(network_layers(plan, reused))


def kept_stages(plan: BuildPlan, store_root: Path) -> frozenset[int]:
    """The builder stages whose outputs an earlier build kept (``stepcache``): not run."""
    from frank.assemble import stepcache

    return frozenset(x.index for x in plan.layers
                     if x.stage and stepcache.cached(store_root, x) is not None)


def build_with_engine(plan: BuildPlan, root: Path, context: Path, out: Path,
                      engine_name: str, mirrors: tuple[Path, ...] = ()) -> BuildResult:
    """Build the Dockerfile context with a container engine, exported as an OCI layout."""
    from frank.assemble import stepcache
    from frank.assemble.base import resolve_base
    from frank.assemble.engines import build_dockerfile, get_engine
    from frank.store.blobs import BlobStore

    store = BlobStore()
    log = context.parent / "build.log"
    engine = get_engine(engine_name, store)
    if engine.name == "docker":  # it builds offline steps only: said before any work
        from frank.assemble.dockerbuild import refuse_network

        refuse_network(network_layers(plan, kept_stages(plan, store.root)))
    # the host's part first: a source that cannot be fetched stops before the base is made
    reused = stage_host_layers(plan, root, context, log=log, store_root=store.root,
                               mirrors=mirrors, mounts=engine.name != "docker")
    base = resolve_base(root / "images" / f"{plan.base_image['name']}.toml", store)
    digest = build_dockerfile(engine, context, out, base_layout=base.layout,
                              base_digest=base.digest,
                              source_date_epoch=plan.source_date_epoch,
                              network=needs_network(plan, reused))
    with log.open("a", encoding="utf-8") as note:
        for layer in plan.layers:
            if layer.stage is None:
                continue
            if layer.index in reused:
                note.write(f"frank: {layer.name}: its stage's outputs were kept from a build "
                           f"of key {layer.key[:16]}; not run again\n")
            elif stepcache.save(store.root, layer, out):
                note.write(f"frank: {layer.name}: outputs kept for key {layer.key[:16]}\n")
    return BuildResult(digest=digest, layout=out, builder=engine_name, why="",
                       layers_built=len(plan.layers) - len(reused),
                       layers_reused=len(reused))


# The step's line as it ran: buildah's echo of each RUN command holds the same words, quoted
# (followed by ``' >&2``), which the end of line rules out.
_STEP_SAID = re.compile(r"frank: (step \S+ (?:did not produce its output|removes|changed "
                        r"files outside|needs python3) [^'\n]*)$", re.MULTILINE)


def _step_failure(log: Path) -> str | None:
    """The line a builder stage's own check wrote (an output a step did not produce, a file
    it removes that is not there), if the failed build's log has one."""
    if not log.is_file():
        return None
    # anywhere in a line: the container's stderr and buildah's own output share one pipe,
    # so the step's line can follow a progress note that ended without a newline
    said = _STEP_SAID.findall(log.read_text(encoding="utf-8", errors="replace"))
    return said[-1].strip() if said else None


def build(plan: BuildPlan, root: Path, out_dir: Path, requested: Builder, *,
          mirrors: tuple[Path, ...] = (), quiet: bool = False,
          tap: Callable[[], Tap] | None = None) -> BuildResult:
    """Build the plan's image into ``out_dir/image`` with the chosen builder (``tap``: fed
    each layer the embedded builder streams, see ``layerpool``; engines ignore it).

    A failure keeps its log: it is copied to the final output folder's ``build.log``
    (``out_dir`` may be a stage that is thrown away) and the error names it.
    """
    from frank.image.outdir import final_path
    from frank.store.blobs import BlobMovedAside

    name, why = choose_builder(plan, requested)
    layout = out_dir / "image"
    log = out_dir / "build.log"
    try:
        if name == "oci":
            try:
                result = build_oci(plan, root, layout, log=log, mirrors=mirrors, quiet=quiet,
                                   tap=tap)
            except BlobMovedAside as exc:  # healed, not used: the next pass makes it again
                _log(log, f"{exc.one_line()}; building again")
                result = build_oci(plan, root, layout, log=log, mirrors=mirrors, quiet=quiet,
                                   tap=tap)
        else:
            result = build_with_engine(plan, root, out_dir / "context", layout, name, mirrors)
    except FrankError as exc:
        said = _step_failure(log)
        if said is not None:  # a step's own words first (the command line quotes them too)
            exc.message = f"{said}: {exc.message}"
        kept = final_path(out_dir) / "build.log"
        if log.is_file() and kept != log:
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, kept)
            # the stage folder is thrown away: the error names the log that is kept
            exc.message = exc.message.replace(str(log), str(kept))
        if log.is_file() and "build.log" not in exc.message:
            exc.message += f" (build log: {kept})"
        raise
    return BuildResult(digest=result.digest, layout=result.layout, builder=name, why=why,
                       layers_built=result.layers_built, layers_reused=result.layers_reused,
                       tapped=result.tapped)
