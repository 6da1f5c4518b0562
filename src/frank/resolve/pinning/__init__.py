"""Turning a mutable reference (tag, branch, release, image tag) into a content pin.

One module per source, each a single function from (where, reference) to a pin:
``git`` (ls-remote), ``hub`` (Hugging Face revision), ``index`` (a wheel's URL and
sha256 from a PEP 503/691 index), ``registry`` (an image digest from a registry's v2 API).
"""
