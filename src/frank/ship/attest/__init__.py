"""What an image is made of and how, signed, attached beside it (never inside it).

``inventory`` lists every component an image's lock pins (the base's Debian packages, each
wheel of the Python closure, each part's inputs, the launcher, the lock, the weights served
with it), each with its hash, its source URL and the part it came from. ``sbom`` writes it as
CycloneDX JSON, ``provenance`` as an in-toto Statement with a SLSA provenance v1 predicate,
``dsse`` signs both (ECDSA P-256, the envelope ``cosign verify-attestation --key`` reads),
``layout`` attaches them to the OCI layout as referrers (OCI 1.1 ``subject``), ``remote``
pushes and reads them through a registry, ``check`` verifies them against the image's lock.
"""

from importlib.metadata import PackageNotFoundError, version

from frank.errors import FrankError

PREDICATE_SBOM = "https://cyclonedx.org/bom"
PREDICATE_SLSA = "https://slsa.dev/provenance/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


def frank_version() -> str:
    """The installed frank's version (the builder's version in the provenance)."""
    try:
        return version("frank")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


class VerifyFailed(FrankError):
    """An attestation that does not hold: one line, exit 1 (bad input stays exit 2)."""

    exit_code = 1
