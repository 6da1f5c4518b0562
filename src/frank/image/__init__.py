"""The OCI image format: layer tars, layouts, manifests, verification, registries.

One job: turn an image spec (``spec``) into byte-reproducible OCI data and read it back
checked. ``layer`` writes deterministic tars, ``oci`` layouts and manifests, ``verify`` checks
every blob of a layout against its digest, ``remote`` is the OCI distribution client (inspect,
pull, push through skopeo), ``outdir`` swaps a finished output folder into ``out/`` atomically.
It knows nothing of parts, stacks or locks.

May import: the root modules, frank.model, frank.store.
"""
