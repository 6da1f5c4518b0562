# frank's dev shell as a devenv module (flake.nix: devShells.default, `nix develop
# --no-pure-eval`). The same tools scripts/setup installs from Debian, from nixpkgs here:
# Python 3.11 with a venv holding frank and its dev extra, nvcc for the kernels, buildah,
# skopeo and umoci for images, gpgv (gnupg) for the .deb bases, a registry for the tests.
{ pkgs, ... }:
let
  cuda = pkgs.cudaPackages;
in
{
  languages.python = {
    enable = true;
    package = pkgs.python311;
    # A venv under .devenv/state/venv; frank and the dev extra go in on entering.
    venv.enable = true;
  };

  packages = [
    # images: builders, registry client, layout tool, gpgv for the .deb bases' InRelease
    pkgs.buildah
    pkgs.skopeo
    pkgs.umoci
    pkgs.gnupg
    # the tests' local registry (Debian ships it as docker-registry, see scripts below)
    pkgs.distribution
    # kernels: nvcc and the CUDA runtime headers
    cuda.cuda_nvcc
    cuda.cuda_cudart
    cuda.cuda_cccl
    # test and CI tools outside the venv
    pkgs.git
    pkgs.gnupatch
    pkgs.shellcheck
  ];

  env = {
    CUDA_HOME = "${cuda.cuda_nvcc}";
    FRANK_DEV_SHELL = "devenv";
  };

  # tests/image/conftest.py starts Debian's `docker-registry`; nixpkgs calls it `registry`.
  scripts.docker-registry.exec = ''exec ${pkgs.distribution}/bin/registry "$@"'';

  enterShell = ''
    # frank (editable) and its dev extra into devenv's venv, again only when pyproject.toml
    # changed; the same as scripts/setup does for .venv.
    stamp="$DEVENV_STATE/frank-dev-extra.sha256"
    want="$(sha256sum "$DEVENV_ROOT/pyproject.toml" | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
      python -m pip install --quiet --disable-pip-version-check -e "$DEVENV_ROOT[dev]" &&
        echo "$want" >"$stamp"
    fi
    echo "frank dev shell: $(python --version), nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $(buildah --version)"
  '';

  # `devenv test` / CI in the shell: the project's own test command.
  enterTest = ''
    scripts/test
  '';
}
