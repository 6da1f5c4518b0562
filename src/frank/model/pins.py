"""Content pins: the only kind of external reference a manifest may carry.

A tag, a branch, a short hash or an image tag can move under us; a full commit, a sha256,
an image digest or a hub revision hash cannot. Each pin is an annotated ``str`` whose
validator refuses anything mutable with a message that says what to do instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, GetCoreSchemaHandler
from pydantic_core import core_schema

# A content digest as OCI and the store spell it.
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def matching(pattern: str, what: str) -> Callable[[str], str]:
    """A validator accepting only a full match of ``pattern``; ``what`` ends the message
    "VALUE is not WHAT". Every string type with a shape (pins, names, archs) uses it."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return check


check_commit = matching(
    r"[0-9a-f]{40}", "a full 40-hex commit (a tag, branch or short hash can move or be "
    "ambiguous; `frank pin` resolves one into a commit)")
check_sha256 = matching(r"[0-9a-f]{64}", "a 64-hex sha256")
check_hub_revision = matching(
    r"[0-9a-f]{40}", "a 40-hex hub revision hash (a branch or tag such as 'main' is mutable; "
    "`frank pin` resolves it)")
check_image_ref = matching(
    r"[A-Za-z0-9][A-Za-z0-9._/:+-]*@sha256:[0-9a-f]{64}",
    "pinned by digest (write NAME@sha256:<64 hex>; a tag can move)")
check_digest = matching(r"sha256:[0-9a-f]{64}", "a digest of the form sha256:<64 hex>")

Commit = Annotated[str, AfterValidator(check_commit)]
Sha256 = Annotated[str, AfterValidator(check_sha256)]
HubRevision = Annotated[str, AfterValidator(check_hub_revision)]
ImageRef = Annotated[str, AfterValidator(check_image_ref)]
Digest = Annotated[str, AfterValidator(check_digest)]


# --- grammars of the free-text fields that reach a shell, a Dockerfile or a path ---------
# Validated at manifest and stack validation, so a hostile value never gets as far as a
# build; the Dockerfile writer quotes every value as well (frank.assemble.context).

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
# What a URL may hold here: RFC 3986's unreserved and delimiter characters, less those a
# shell or a Dockerfile gives meaning to (quotes, $, `, ;, &, |, <, >, parentheses, \).
_URL_CHARS = r"[A-Za-z0-9._~:/?#\[\]@%+=,!*-]+"
# POSIX portable file-name characters (plus "+"): one component of a path we write.
_PATH_PART = re.compile(r"[A-Za-z0-9_.+-]+")
# PEP 440's public and local version grammar (its appendix B), case-insensitive.
_PEP440 = (r"v?(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*"
           r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?"
           r"(?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?"
           r"(?:[-_.]?dev[-_.]?[0-9]*)?"
           r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?")


def check_one_line(value: str) -> str:
    """Free text that reaches a file or a command line: no newline, NUL or other control
    character (a newline in a Dockerfile value starts a new instruction)."""
    bad = CONTROL_CHARS.search(value)
    if bad:
        raise ValueError(f"{value!r} holds a control character ({bad.group()!r})")
    return value


check_distribution = matching(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?",
    "a distribution name (PEP 508: letters, digits, '.', '_', '-')")
check_version = matching(rf"(?i:{_PEP440})", "a version (PEP 440, e.g. 0.24.0)")
check_url_text = matching(
    _URL_CHARS, "a URL without spaces, quotes or shell characters ($ ` ; & | < > ( ) \\)")
check_entry_point_name = matching(r"[A-Za-z0-9_][A-Za-z0-9_.-]*",
                                  "an entry-point name (letters, digits, '_', '.', '-')")
_check_git_shape = matching(r"(https?|ssh|git|file)://\S+|[\w.-]+@[\w.-]+:\S+",
                            "a git remote URL")


def check_git_url(value: str) -> str:
    """A git remote (URL or scp-like ``user@host:path``) with no shell characters."""
    return check_url_text(_check_git_shape(value))


def check_raw_one_line(value: object) -> object:
    """``check_one_line`` before parsing (a URL parser drops a newline silently); a value
    that is not text is left to the parser to refuse."""
    return check_one_line(value) if isinstance(value, str) else value


def check_url(value: object) -> object:
    """An already-parsed URL whose text holds no shell or Dockerfile characters."""
    check_url_text(str(value))
    return value


def wheel_filename(url: str) -> str:
    """A wheel's file name from its URL, unescaped: an index spells a local version's "+"
    as "%2B" (``torch-2.11.0%2Bcu128-...whl``), which is not a wheel name until unescaped."""
    from urllib.parse import unquote, urlsplit

    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])


# query parameters that carry a secret (signed URLs of S3, GCS, Azure; API keys; tokens)
_SECRET_PARAM = re.compile(r"(?i)token|secret|passw|pwd|auth|key|sig|credential|session|"
                           r"^x-amz-|^x-goog-|^se$|^sp$|^sv$")


def redact_url(value: str) -> str:
    """``value`` with its user-info and every secret-like query value replaced by ``***``:
    how a URL is shown in a message (never the secret itself)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(value)
    except ValueError:
        return "<a URL that does not parse>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        query = urlencode([(k, "***" if _SECRET_PARAM.search(k) else v)
                           for k, v in parse_qsl(query, keep_blank_values=True)], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_no_credentials(value: str) -> str:
    """A URL that carries no secret: no user-info on http(s) (``user:token@``, or a token
    as the user), no password on any scheme, no token-like query parameter. A URL is
    written into the lock, plan.json and the image; credentials come from netrc at fetch
    time (``frank.store.fetch.netrc_auth``), never from a manifest. The message shows the
    URL redacted."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(value)
    except ValueError:
        return value  # the URL check says what is wrong with it
    web = parts.scheme in ("http", "https")
    if parts.password is not None or (web and parts.username is not None):
        raise ValueError(f"{redact_url(value)} holds credentials (user-info): a URL is "
                         "written into the lock and the image; put them in ~/.netrc "
                         "(or $NETRC), read only when fetching")
    secret = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True)
              if _SECRET_PARAM.search(k)]
    if secret:
        raise ValueError(f"{redact_url(value)} holds a token-like query parameter "
                         f"({secret[0]}): a URL is written into the lock and the image; "
                         "give a URL without it and the credentials in ~/.netrc")
    return value


def check_index_url(value: str) -> str:
    """A package index's URL (PEP 503 simple API): no credentials in it, since the URL is
    written into the stack's lock and pylock (give them to the network layer: netrc)."""
    from urllib.parse import urlsplit

    check_no_credentials(value)
    parts = urlsplit(value)
    if parts.query or parts.fragment:
        raise ValueError(f"{redact_url(value)} has a query or fragment; an index is a "
                         "plain URL")
    return value


def check_relative_path(value: str) -> str:
    """A relative path (a subdirectory, a file in a hub repo) that stays where it is put:
    portable file-name characters, no '..', no leading '/'."""
    parts = value.split("/")
    if value.startswith("/") or any(p in ("", ".", "..") or not _PATH_PART.fullmatch(p)
                                    for p in parts):
        raise ValueError(f"{value!r} is not a relative path of plain names "
                         "(letters, digits, '_', '.', '+', '-'; no '..', no leading '/')")
    return value


def check_image_path(value: str) -> str:
    """A path in the image, normalized: absolute, never the root itself, never leaving it,
    portable file-name characters only (it becomes a path on the host while staging)."""
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path in the image")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{value!r} leaves its place with '..'")
    if not parts:
        raise ValueError(f"{value!r} names the image root; give a file's path")
    bad = next((p for p in parts if not _PATH_PART.fullmatch(p)), None)
    if bad is not None:
        raise ValueError(f"{value!r} has a name with characters other than letters, digits, "
                         f"'_', '.', '+', '-' ({bad!r})")
    return "/" + "/".join(parts)


OneLine = Annotated[str, AfterValidator(check_one_line)]
Distribution = Annotated[str, AfterValidator(check_distribution)]
Version = Annotated[str, AfterValidator(check_version)]
EntryPointName = Annotated[str, AfterValidator(check_entry_point_name)]
RelativePath = Annotated[str, AfterValidator(check_relative_path)]
ImagePath = Annotated[str, AfterValidator(check_image_path)]
GitUrl = Annotated[str, AfterValidator(check_no_credentials), AfterValidator(check_git_url)]


class _HttpUrlText:
    """pydantic's ``HttpUrl`` check and normal form, kept as text: the same core URL schema
    (http or https, a host, at most 2083 characters) without importing ``pydantic.networks``
    (and ``importlib.metadata`` with it), which read commands would pay for at every start."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            str, core_schema.url_schema(max_length=2083, allowed_schemes=["http", "https"],
                                        host_required=True),
            serialization=core_schema.to_string_ser_schema())


# A newline or tab is checked before parsing: the URL parser would drop it silently.
SafeHttpUrl = Annotated[str, _HttpUrlText, BeforeValidator(check_raw_one_line),
                        AfterValidator(check_no_credentials), AfterValidator(check_url)]
IndexUrl = Annotated[SafeHttpUrl, AfterValidator(check_index_url)]
