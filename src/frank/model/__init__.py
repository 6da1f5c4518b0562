"""What people write: part manifests (``kinds/``), stacks, the catalog, base image files.

One job: parse and validate the files in ``parts/``, ``stacks/`` and ``images/`` into typed
models (pydantic, ``extra="forbid"``), so every bad field is one line naming file and field.
Nothing here fetches, hashes a store or builds. ``archs`` spells CUDA archs; ``diffs``,
``pyproject`` and ``sources`` are the small readers a manifest check needs (a patch's files, a
plugin's static metadata, where a local git source may live).

May import: the root modules (errors, fsutil, hashing) only.
"""
