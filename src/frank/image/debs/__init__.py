"""A base image from Debian packages pinned by version and sha256, the same on any machine.

As Bazel's rules_distroless does: ``images/<name>.toml`` names a suite and the packages
wanted (``[debs]``); ``images/<name>.debs.lock`` pins the whole dependency closure (each
.deb's archive path, size and sha256, read from the archive's signed Packages index). A
build needs only the lock and the .debs: each is fetched on the host and verified, its
data is merged into one tar with fixed mtimes in lock order, dpkg's status is written, and
no maintainer script runs, so the same lock gives the same base digest everywhere.

Modules: ``lock`` (recipe and lock models, offline), ``archive`` (signed indexes),
``resolver`` (the closure), ``rootfs`` (the deterministic layer), ``build`` (fetch, build,
cache). ``python -m frank.image.debs lock images/NAME.toml`` writes a lock.
"""
