# `devenv shell` reads this file; the shell itself is defined once, in nix/devenv.nix,
# which flake.nix also uses for `nix develop`.
{ imports = [ ./nix/devenv.nix ]; }
