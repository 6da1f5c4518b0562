"""What an image is made of and how, signed, attached beside it (never inside it).

``inventory`` lists every component an image's lock pins (the base's Debian packages, each
wheel of the Python closure, each part's inputs, the launcher, the lock, the weights served
with it), each with its hash, its source URL and the part it came from. ``sbom`` writes it as
CycloneDX JSON, ``provenance`` as an in-toto Statement with a SLSA provenance v1 predicate,
``dsse`` signs both (ECDSA P-256, the envelope ``cosign verify-attestation --key`` reads),
``layout`` attaches them to the OCI layout as referrers (OCI 1.1 ``subject``), ``remote``
pushes and reads them through a registry, ``check`` verifies them against the image's lock.
"""

PREDICATE_SBOM = "https://cyclonedx.org/bom"
PREDICATE_SLSA = "https://slsa.dev/provenance/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
