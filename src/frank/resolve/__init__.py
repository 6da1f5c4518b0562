"""Manifest -> lock: a stack resolved into parts, its Python closure and every pin hashed.

One job: decide exactly what an image will hold, by content, and write it down. ``resolver``
resolves a stack (extends, parts, the base), ``closure`` locks the Python closure with uv
(pylock), ``lock`` is the lock file, ``project`` does it for every stack of the repo,
``standing`` checks a part's history, ``pinning/`` turns branches and tags into content pins,
``debs/`` resolves a base's Debian packages into its lock.

May import: the root modules, frank.model, frank.store, frank.image.
"""
