"""A base's Debian packages resolved into ``images/<name>.debs.lock``, as rules_distroless does.

``images/<name>.toml`` names a suite and the packages wanted (``[debs]``, frank.model.imagefile);
the lock pins the whole dependency closure: each .deb's archive path, size and sha256, read
from the archive's signed Packages index. Modules: ``lock`` (the lock's model, offline),
``archive`` (signed indexes, the mirror apt uses here), ``resolver`` (the closure).
``frank debs lock images/NAME.toml`` (or ``python -m frank.cli.debs lock``) writes a lock;
frank.assemble.debs makes the base from it.
"""
