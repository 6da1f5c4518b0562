"""A base image made from a ``.debs.lock`` (frank.resolve.debs), the same on any machine.

A build needs only the lock and the .debs: each is fetched on the host and verified, its
data is merged into one tar with fixed mtimes in lock order, dpkg's status is written, and
no maintainer script runs, so the same lock gives the same base digest everywhere.
Modules: ``rootfs`` (the deterministic layer), ``build`` (fetch, build, cache).
"""
