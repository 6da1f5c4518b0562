"""The image against its lock: what the stack declares is what the image holds, proved.

One job: read a built image's layers as a container sees them and compare every file,
distribution, GPU library and config value with what the lock and its build plan say.
``layers`` reads and merges the layer blobs in one pass (hashing every file), ``cuda`` reads
the SASS and PTX archs an ELF file holds, ``expect`` derives what the image must hold from
the lock and its plan, ``checks`` compares the two, ``report`` is the result (one line per
difference) and its record next to the layout, keyed by the manifest digest, that ``frank
run``, ``push`` and ``trial run`` consult before they use an image.

May import: the root modules, frank.model, frank.store, frank.image, frank.resolve,
frank.assemble.
"""
