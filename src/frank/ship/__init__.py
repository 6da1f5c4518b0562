"""Getting an image to where it runs: pushes, attestations, Kubernetes objects.

One job: publish what was built, signed and described. ``pushes`` pushes by digest and records
it, ``attest/`` writes and checks signed SBOM and provenance referrers, ``render/`` renders
Kubernetes objects from a lock and a recorded push.

May import: the root modules and every stage up to frank.run.
"""
