{
  # frank as a Nix flake: a dev shell made through devenv (Python 3.11, nvcc, buildah,
  # skopeo, umoci, the test tools) and a package output for the frank CLI. See docs/ci.md.
  #
  #   nix develop --no-pure-eval      the dev shell (devenv needs to see the work tree)
  #   nix build .#frank               the CLI, from pyproject.toml
  #   nix run . -- --help
  #
  # The tests check this file offline (tests/test_nix_flake.py): nixpkgs and devenv are
  # replaced by small local stubs with --override-input, so nothing is downloaded there.
  description = "frank: declarative build-and-deploy for LLM engine variants";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";
    devenv.url = "github:cachix/devenv";
  };

  outputs =
    { self, nixpkgs, devenv, ... }@inputs:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];

      # CUDA (nvcc, cudart) is unfree in nixpkgs.
      pkgsFor = system: import nixpkgs {
        inherit system;
        config.allowUnfree = true;
      };
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f (pkgsFor system));

      project = (builtins.fromTOML (builtins.readFile ./pyproject.toml)).project;

      # "pydantic>=2.7,<3" -> "pydantic": nixpkgs names Python packages as PyPI does.
      depName = spec: builtins.head (builtins.match "([A-Za-z0-9_.-]+).*" spec);

      # Only what the wheel is built from: pyproject.toml and src/ (no caches, no out/).
      root = toString ./.;
      relative = path: builtins.substring (builtins.stringLength root + 1) 4096 (toString path);
      source = builtins.path {
        path = ./.;
        name = "frank-source";
        filter = path: type:
          let
            rel = relative path;
            base = baseNameOf path;
          in
          (rel == "pyproject.toml" || rel == "README.md" || rel == "src"
            || builtins.substring 0 4 rel == "src/")
          && base != "__pycache__" && builtins.match ".*\\.pyc" base == null;
      };

      frankFor = pkgs:
        let
          python = pkgs.python311;
        in
        python.pkgs.buildPythonApplication {
          pname = project.name;
          inherit (project) version;
          pyproject = true;
          src = source;
          build-system = [ python.pkgs.setuptools ];
          dependencies = map (spec: python.pkgs.${depName spec}) project.dependencies;
          # frank drives these at run time: push/pull (skopeo), RUN-step builds and the
          # --print smoke check (buildah), OCI layouts (umoci), InRelease checks of .deb bases (gpgv).
          makeWrapperArgs = [
            "--suffix"
            "PATH"
            ":"
            (pkgs.lib.makeBinPath [ pkgs.skopeo pkgs.buildah pkgs.umoci pkgs.gnupg ])
          ];
          pythonImportsCheck = [ "frank" "frank.cli" ];
          # The suite needs buildah, a registry and the network: run it in the dev shell.
          doCheck = false;
          meta = {
            inherit (project) description;
            license = pkgs.lib.licenses.asl20;
            mainProgram = "frank";
          };
        };
    in
    {
      packages = forAllSystems (pkgs: rec {
        frank = frankFor pkgs;
        default = frank;
      });

      devShells = forAllSystems (pkgs: {
        default = devenv.lib.mkShell {
          inherit inputs pkgs;
          modules = [ ./nix/devenv.nix ];
        };
      });
    };
}
