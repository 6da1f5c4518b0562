"""flake.nix, checked offline with Debian's nix-bin (Nix 2.8) and small local stub inputs.

``nix-instantiate --parse`` checks the syntax of flake.nix and nix/devenv.nix. ``nix flake
check`` then evaluates every output with nixpkgs and devenv replaced (``--override-input``)
by stubs this test writes: a nixpkgs whose packages are trivial derivations and whose
``buildPythonApplication`` checks the arguments it is given, and a devenv whose ``mkShell``
accepts only devenv options the flake's module may set. A missing package, a misspelled
option, a forgotten ``allowUnfree`` for CUDA or a syntax error all fail the check; the
broken copies below prove it. Nothing is downloaded: the store is a temp dir
(``--store``), and ``--offline`` is given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.spine_helpers import REPO

NIX = shutil.which("nix")
pytestmark = pytest.mark.skipif(NIX is None, reason="nix not installed (apt-get install nix-bin)")

# What the flake's outputs may use from nixpkgs. Every name is a trivial derivation.
STUB_PACKAGES = ["buildah", "skopeo", "umoci", "gnupg", "distribution", "git",
                 "gnupatch", "shellcheck", "nix"]
STUB_PYTHON_PACKAGES = ["setuptools", "pydantic", "click", "tomlkit", "rich", "pytest",
                        "huggingface-hub", "packaging", "installer", "uv", "python-debian",
                        "cyclonedx-python-lib", "in-toto-attestation", "cryptography",
                        "kubernetes", "pyyaml", "jsonschema", "isal", "docker",
                        "zstandard", "jinja2", "pygal"]
STUB_CUDA_PACKAGES = ["cuda_nvcc", "cuda_cudart", "cuda_cccl"]

STUB_NIXPKGS_FLAKE = """{
  description = "stub nixpkgs for frank's offline flake check";
  outputs = { self }: {
    lib = import ./lib.nix;
    legacyPackages.x86_64-linux = import ./default.nix { system = "x86_64-linux"; };
    legacyPackages.aarch64-linux = import ./default.nix { system = "aarch64-linux"; };
  };
}
"""

STUB_LIB = """rec {
  genAttrs = names: f: builtins.listToAttrs (map (n: { name = n; value = f n; }) names);
  makeBinPath = pkgs: builtins.concatStringsSep ":" (map (p: "${p}/bin") pkgs);
  licenses.asl20 = { spdxId = "Apache-2.0"; free = true; };
  isDerivation = x: builtins.isAttrs x && (x.type or null) == "derivation";
}
"""

# Trivial derivations, never built (nix flake check instantiates them: .drv files only).
STUB_NIXPKGS = """{ system ? builtins.currentSystem, config ? { }, overlays ? [ ], ... }:
let
  lib = import ./lib.nix;
  mk = name: derivation {
    inherit name system;
    builder = "/bin/sh";
    args = [ "-c" "echo stub > $out" ];
  };
  set = names: builtins.listToAttrs (map (n: { name = n; value = mk n; }) names);
  need = cond: msg: if cond then true else throw "stub nixpkgs: ${msg}";
  pythonPackages = set @PYTHON@ // {
    buildPythonApplication = args:
      assert need (builtins.isString args.pname && builtins.isString args.version)
        "buildPythonApplication needs pname and version strings";
      assert need ((args.pyproject or false) == true || args ? format)
        "buildPythonApplication needs pyproject = true (or format)";
      assert need (builtins.pathExists "${args.src}/pyproject.toml")
        "buildPythonApplication src has no pyproject.toml";
      assert need (builtins.pathExists "${args.src}/src/frank/__init__.py")
        "buildPythonApplication src has no src/frank";
      assert need (!(builtins.pathExists "${args.src}/tests"))
        "buildPythonApplication src should hold pyproject.toml and src/ only";
      assert need (builtins.all lib.isDerivation (args.dependencies or [ ]))
        "buildPythonApplication dependencies must be packages";
      assert need (builtins.all lib.isDerivation (args.build-system or [ ]))
        "buildPythonApplication build-system must be packages";
      assert need (builtins.all builtins.isString (args.makeWrapperArgs or [ ]))
        "makeWrapperArgs must be strings";
      assert need ((args.meta.mainProgram or null) == args.pname)
        "meta.mainProgram should be the CLI";
      derivation {
        name = "${args.pname}-${args.version}";
        inherit system;
        builder = "/bin/sh";
        args = [ "-c" "echo stub > $out" ];
        src = args.src;
        dependencies = args.dependencies;
        wrapperArgs = args.makeWrapperArgs or [ ];
      } // { inherit (args) meta; dependencyNames = map (d: d.name) args.dependencies; };
  };
  python311 = mk "python3-3.11" // { pkgs = pythonPackages; pythonVersion = "3.11"; };
in
set @PACKAGES@ // {
  inherit lib python311 system;
  cudaPackages =
    if (config.allowUnfree or false) then set @CUDA@
    else throw "stub nixpkgs: CUDA is unfree; import nixpkgs with config.allowUnfree = true";
}
"""

STUB_DEVENV_FLAKE = """{
  description = "stub devenv for frank's offline flake check";
  outputs = { self }: { lib.mkShell = import ./mkshell.nix; };
}
"""

# devenv.lib.mkShell { inputs, pkgs, modules }: each module is called (or taken) as devenv
# would, its options checked against the devenv options frank uses, and a shell derivation
# made that depends on every package (so a missing package fails the check).
STUB_MKSHELL = """{ inputs, pkgs, modules }:
let
  lib = pkgs.lib;
  need = cond: msg: if cond then true else throw "stub devenv: ${msg}";
  known = [ "languages" "packages" "env" "enterShell" "enterTest" "scripts" "processes"
            "services" "git-hooks" "dotenv" "name" "devenv" "tasks" "cachix" ];
  knownPython = [ "enable" "package" "version" "venv" "uv" "poetry" "manylinux" "libraries"
                  "directory" ];
  load = m: let f = if builtins.isPath m then import m else m; in
    if builtins.isFunction f then f { inherit pkgs lib inputs; config = { }; } else f;
  cfgs = map load modules;
  merged = builtins.foldl' (a: b: a // b // {
    packages = (a.packages or [ ]) ++ (b.packages or [ ]);
    env = (a.env or { }) // (b.env or { });
  }) { } cfgs;
  python = merged.languages.python or { };
  checks = [
    (need (builtins.all (c: builtins.all (k: builtins.elem k known) (builtins.attrNames c)) cfgs)
      "unknown option in ${builtins.toJSON (map builtins.attrNames cfgs)}")
    (need (builtins.all lib.isDerivation merged.packages) "packages must all be derivations")
    (need (builtins.all (k: builtins.elem k knownPython) (builtins.attrNames python))
      "unknown languages.python option in ${builtins.toJSON (builtins.attrNames python)}")
    (need (!(python ? package) || lib.isDerivation python.package)
      "languages.python.package must be a package")
    (need (builtins.all (n: builtins.isString (merged.scripts.${n}.exec or null))
      (builtins.attrNames (merged.scripts or { }))) "scripts.<name>.exec must be a string")
  ];
  shell = derivation {
    name = "devenv-shell";
    inherit (pkgs) system;
    builder = "/bin/sh";
    args = [ "-c" "echo stub > $out" ];
    packages = merged.packages ++ (if python ? package then [ python.package ] else [ ]);
    shellEnv = builtins.toJSON merged.env;
    enterShell = merged.enterShell or "";
    scripts = builtins.toJSON (merged.scripts or { });
  };
in
assert builtins.all (c: c) checks;
shell // {
  config = merged;
  packageNames = map (p: p.name) shell.packages;
}
"""


def write_stubs(dest: Path) -> dict[str, Path]:
    """Write the stub nixpkgs and devenv flakes under dest; return input name -> folder."""
    nixpkgs = dest / "stub-nixpkgs"
    devenv = dest / "stub-devenv"
    nixpkgs.mkdir(parents=True)
    devenv.mkdir(parents=True)

    def nix_list(names: list[str]) -> str:
        return "[ " + " ".join(json.dumps(n) for n in names) + " ]"

    (nixpkgs / "flake.nix").write_text(STUB_NIXPKGS_FLAKE)
    (nixpkgs / "lib.nix").write_text(STUB_LIB)
    (nixpkgs / "default.nix").write_text(
        STUB_NIXPKGS.replace("@PACKAGES@", nix_list(STUB_PACKAGES))
        .replace("@PYTHON@", nix_list(STUB_PYTHON_PACKAGES))
        .replace("@CUDA@", nix_list(STUB_CUDA_PACKAGES)))
    (devenv / "flake.nix").write_text(STUB_DEVENV_FLAKE)
    (devenv / "mkshell.nix").write_text(STUB_MKSHELL)
    return {"nixpkgs": nixpkgs, "devenv": devenv}


def copy_flake(dest: Path) -> Path:
    """What the flake reads: flake.nix (+ flake.lock), nix/, pyproject.toml, README, src/."""
    dest.mkdir(parents=True)
    for name in ("flake.nix", "flake.lock", "pyproject.toml", "README.md"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "nix", dest / "nix", ignore=ignore)
    shutil.copytree(REPO / "src", dest / "src", ignore=ignore)
    return dest


class Nix:
    """Nix 2.8 with flakes on, a private store and cache under one temp dir, offline."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.store = base / "store"
        (base / "home").mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "HOME": str(base / "home"),
            "XDG_CACHE_HOME": str(base / "cache"),
            "XDG_CONFIG_HOME": str(base / "config"),
            "XDG_DATA_HOME": str(base / "data"),
            "NIX_CONFIG": "experimental-features = nix-command flakes\nsandbox = false\n"
                          "substituters =\nwarn-dirty = false\n",
        }
        self.env.pop("NIX_PATH", None)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        assert NIX is not None
        return subprocess.run([NIX, "--store", str(self.store), *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def flake_args(self, flake: Path, stubs: dict[str, Path]) -> list[str]:
        args = [f"path:{flake}", "--offline", "--no-write-lock-file"]
        for name, folder in stubs.items():
            args += ["--override-input", name, f"path:{folder}"]
        return args

    def check(self, flake: Path, stubs: dict[str, Path]) -> subprocess.CompletedProcess[str]:
        return self.run("flake", "check", *self.flake_args(flake, stubs))

    def eval_json(self, flake: Path, stubs: dict[str, Path], attr: str) -> object:
        args = self.flake_args(flake, stubs)
        proc = self.run("eval", "--json", f"{args[0]}#{attr}", *args[1:])
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture
def nix(tmp_path: Path) -> Nix:
    return Nix(tmp_path / "nix")


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, Path]:
    return write_stubs(tmp_path / "stubs")


def parse(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nix-instantiate", "--store", str(tmp_path / "parse-store"),
                           "--parse", str(path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path)})


@pytest.mark.parametrize("name", ["flake.nix", "nix/devenv.nix"])
def test_nix_files_parse(name: str, tmp_path: Path) -> None:
    proc = parse(REPO / name, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_parse_catches_a_syntax_error(tmp_path: Path) -> None:
    bad = tmp_path / "flake.nix"
    bad.write_text((REPO / "flake.nix").read_text().replace("outputs =", "outputs = {", 1))
    proc = parse(bad, tmp_path)
    assert proc.returncode != 0 and "syntax error" in proc.stderr, proc.stderr


def test_flake_check_passes_with_stub_inputs(nix: Nix, stubs: dict[str, Path],
                                            tmp_path: Path) -> None:
    flake = copy_flake(tmp_path / "flake")
    proc = nix.check(flake, stubs)
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr.lower(), proc.stderr


def test_package_and_dev_shell_are_what_the_flake_promises(nix: Nix, stubs: dict[str, Path],
                                                          tmp_path: Path) -> None:
    flake = copy_flake(tmp_path / "flake")
    # The package: name and version from pyproject.toml, its runtime dependencies mapped.
    name = nix.eval_json(flake, stubs, "packages.x86_64-linux.default.name")
    assert name == "frank-0.1.0"
    deps = nix.eval_json(flake, stubs, "packages.x86_64-linux.frank.dependencyNames")
    assert deps == ["pydantic", "click", "tomlkit", "rich", "packaging", "installer", "isal",
                    "uv", "python-debian", "cyclonedx-python-lib", "in-toto-attestation",
                    "cryptography", "kubernetes", "pyyaml", "jsonschema", "docker", "zstandard",
                    "jinja2", "pygal"]
    assert nix.eval_json(flake, stubs, "packages.x86_64-linux.frank.meta.mainProgram") == "frank"
    # The dev shell: Python 3.11, nvcc, the image tools and the test registry.
    shell = "devShells.x86_64-linux.default"
    names = nix.eval_json(flake, stubs, f"{shell}.packageNames")
    assert isinstance(names, list)
    for want in ("python3-3.11", "cuda_nvcc", "buildah", "skopeo", "umoci", "gnupg",
                 "distribution", "shellcheck"):
        assert want in names, (want, names)
    cfg = nix.eval_json(flake, stubs, f"{shell}.config.languages.python.venv.enable")
    assert cfg is True
    scripts = nix.eval_json(flake, stubs, f"{shell}.config.scripts")
    assert isinstance(scripts, dict) and "docker-registry" in scripts


def _missing_package(text: str) -> str:
    return text.replace("pkgs.umoci\n", "pkgs.umoci\n    pkgs.no-such-tool\n", 1)


def _bad_option(text: str) -> str:
    return text.replace("languages.python = {", "language.python = {", 1)


def _bad_python_option(text: str) -> str:
    return text.replace("venv.enable = true;", "venv.enable = true;\n    versoin = \"3.11\";", 1)


def _no_unfree(text: str) -> str:
    return text.replace("config.allowUnfree = true;", "config.allowUnfree = false;", 1)


def _bad_dependency(text: str) -> str:
    return text.replace("project.dependencies;", "(project.dependencies ++ [ \"nope>=1\" ]);", 1)


def _not_a_derivation(text: str) -> str:
    return text.replace("default = frank;", "default = \"frank\";", 1)


BREAKAGES: dict[str, tuple[str, Callable[[str], str], str]] = {
    "missing package": ("nix/devenv.nix", _missing_package, "no-such-tool"),
    "unknown devenv option": ("nix/devenv.nix", _bad_option, "unknown option"),
    "unknown python option": ("nix/devenv.nix", _bad_python_option, "languages.python"),
    "CUDA without allowUnfree": ("flake.nix", _no_unfree, "allowUnfree"),
    "dependency not in nixpkgs": ("flake.nix", _bad_dependency, "nope"),
    "package not a derivation": ("flake.nix", _not_a_derivation, "derivation"),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_flake_check_catches_a_broken_copy(case: str, nix: Nix, stubs: dict[str, Path],
                                           tmp_path: Path) -> None:
    file, breakage, message = BREAKAGES[case]
    flake = copy_flake(tmp_path / "flake")
    text = (flake / file).read_text()
    broken = breakage(text)
    assert broken != text, f"the breakage for {case!r} no longer applies to {file}"
    (flake / file).write_text(broken)
    proc = nix.check(flake, stubs)
    assert proc.returncode != 0, f"{case}: nix flake check passed:\n{proc.stderr}"
    assert message in proc.stderr, proc.stderr
