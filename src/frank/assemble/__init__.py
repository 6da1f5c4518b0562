"""Lock -> build plan -> layers -> image: the embedded builder and, where needed, an engine.

One job: make the image a lock describes. ``plan`` turns a lock into ordered layers,
``context`` writes the plan and Dockerfile context, ``builder`` chooses the builder and
assembles, ``install`` puts wheels into a layer, ``patching`` applies patches to a wheel's
files, ``kernel`` and ``wheel`` compile kernels and build repo wheels, ``stepcache`` keeps a
container step's outputs, ``base``/``baselayout``/``debs/`` make base images, ``engines``
drives container engines (buildah, podman, docker) for the steps that need one.

May import: the root modules, frank.model, frank.store, frank.image, frank.resolve.
"""
