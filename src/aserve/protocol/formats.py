"""Wire formats (JSON, msgpack): content types, negotiation, message encoding.

Also turns msgspec's decode errors into InvalidInput messages that name the field
the way a client wrote it (`inputs[1].shape[0]`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Literal

import msgspec

from ..bounded import Bounded
from ..errors import InvalidInput, UnsupportedMediaType

Format = Literal["json", "msgpack"]

JSON = "application/json"
MSGPACK = "application/msgpack"
OCTET_STREAM = "application/octet-stream"
MSGPACK_TYPES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})
CONTENT_TYPES: dict[str, str] = {"json": JSON, "msgpack": MSGPACK}

# What decoding a malformed body raises: msgspec's errors, and UnicodeDecodeError and
# RecursionError which msgspec lets through for deep nesting, and before 0.23 for bad UTF-8.
DECODE_ERRORS = (msgspec.MsgspecError, UnicodeDecodeError, RecursionError)

_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def media_type(content_type: str | None) -> str:
    """`type/subtype` of a Content-Type header, lower-cased, without parameters."""
    if not content_type:
        return ""
    return content_type.partition(";")[0].strip().lower()


def request_format(content_type: str | None) -> Format:
    """The format a request body is in: msgpack for the msgpack media types, else JSON."""
    fmt = _FORMATS.get(content_type)
    if fmt is None:
        fmt = _FORMATS.remember(content_type, "msgpack" if media_type(content_type) in MSGPACK_TYPES else "json")
    return fmt


_FORMATS: Bounded[str | None, Format] = Bounded(256)  # Content-Type values as clients send them


@lru_cache(maxsize=512)
def negotiate(accept: str | None, content_type: str | None) -> Format:
    """The response format: the best of JSON/msgpack the Accept header names, else the request's.

    Media ranges (`*/*`, `application/*`) and types the server cannot produce defer to
    the request's format; among q-values the highest wins, ties go to the request's.
    """
    default = request_format(content_type)
    if not accept:
        return default
    best: Format = default
    best_q = -1.0
    for part in accept.split(","):
        media, _, params = part.partition(";")
        media = media.strip().lower()
        if media == JSON:
            fmt: Format = "json"
        elif media in MSGPACK_TYPES:
            fmt = "msgpack"
        else:
            continue
        q = _quality(params)
        if q <= 0.0:
            continue
        if q > best_q or (q == best_q and fmt == default):
            best, best_q = fmt, q
    return best


def _quality(params: str) -> float:
    for p in params.split(";"):
        key, _, value = p.partition("=")
        if key.strip().lower() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0


def content_type(fmt: Format, request_content_type: str | None = None) -> str:
    """Content-Type for a response in `fmt`; msgpack answers echo the request's msgpack type."""
    if fmt == "msgpack":
        mt = media_type(request_content_type)
        return mt if mt in MSGPACK_TYPES else MSGPACK
    return JSON


def encode_message(obj: Any, fmt: Format) -> bytes:
    """Any message (dicts, lists, msgspec Structs) as JSON or msgpack bytes."""
    if fmt == "msgpack":
        return _msgpack_encoder.encode(obj)
    return _json_encoder.encode(obj)


class ErrorMessage(msgspec.Struct, omit_defaults=True):
    """Every error response: what went wrong (naming the field, limit or setting and the
    expected value), and for server and model failures the id of the log line that has
    the details."""

    error: str
    error_id: str | None = None


def encode_error(message: str, *, accept: str | None, content_type: str | None = None,
                 error_id: str | None = None) -> tuple[bytes, str]:
    """`{"error": message}` (with `error_id` when given) in the format the client accepts,
    with its Content-Type."""
    fmt = negotiate(accept, content_type)
    return encode_message(ErrorMessage(message, error_id), fmt), CONTENT_TYPES[fmt]


# ---- what request bodies the server reads ----

ENCODINGS = ("gzip", "deflate", "identity")
# curl -d sends application/x-www-form-urlencoded and browsers' fetch text/plain: both read as JSON
JSON_ALIASES = frozenset({JSON, "text/json", "text/plain", "application/x-www-form-urlencoded"})
# Content-Type values seen and accepted, as sent, by whether the endpoint reads msgpack
ACCEPTED: dict[bool, Bounded[str, Format]] = {True: Bounded(256), False: Bounded(256)}


def body_format(content_type: str | None, *, msgpack: bool = True) -> Format:
    """The format of a request body from its Content-Type, or UnsupportedMediaType (415)
    naming the types the endpoint reads. No Content-Type, JSON types (also `+json`,
    text/plain and curl's form type) and application/octet-stream (JSON, with or without
    binary tensors after it) are JSON; the msgpack types are msgpack where `msgpack`."""
    if content_type is None:
        return "json"
    accepted = ACCEPTED[msgpack]
    known = accepted.get(content_type)
    if known is not None:
        return known
    mt = media_type(content_type)
    fmt: Format
    if not mt or mt in JSON_ALIASES or mt == OCTET_STREAM or mt.endswith("+json"):
        fmt = "json"
    elif msgpack and mt in MSGPACK_TYPES:
        fmt = "msgpack"
    else:
        raise UnsupportedMediaType(f"Content-Type: expected {supported_types(msgpack=msgpack)}, got {content_type!r}")
    return accepted.remember(content_type, fmt)


def supported_types(*, msgpack: bool = True) -> str:
    """The request body types an endpoint reads, for error messages."""
    types = f"{JSON} (text/plain and form-encoded bodies are read as JSON), {OCTET_STREAM} (JSON"
    if msgpack:
        return types + f" with the binary tensor extension) or {MSGPACK}"
    return types + ")"


def check_encoding(content_encoding: str | None) -> None:
    """UnsupportedMediaType (415) unless the body's Content-Encoding is one the server
    decodes (gzip, deflate, identity)."""
    if content_encoding is not None and content_encoding.strip().lower() not in ENCODINGS:
        raise UnsupportedMediaType(
            f"Content-Encoding: expected one of {', '.join(ENCODINGS)}, got {content_encoding!r}")


_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def decode_error(
    exc: Exception,
    fmt: Format,
    *,
    field: str = "",
    document: Any = None,
) -> InvalidInput:
    """InvalidInput for a msgspec decode error, naming the field at `field` + its path.

    When msgspec's message does not say what it received (range constraints), the
    value is read back from `document` (the bytes that failed to decode), if given.
    """
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        m = _AT.match(text)
        msg, path = (m["msg"], m["path"]) if m else (text, "")
        where = (field + path).lstrip(".") or "request body"
        msg = _lower(msg)
        if document is not None and ", got " not in msg and "missing required" not in msg:
            found, value = _lookup(document, fmt, path)
            if found:
                msg += f", got {value!r:.80}"
        return InvalidInput(f"{where}: {msg}")
    kind = "JSON" if fmt == "json" else "msgpack"
    where = f"{field}: " if field else "request body: "
    return InvalidInput(f"{where}malformed {kind}: {text}")


def _lookup(document: Any, fmt: Format, path: str) -> tuple[bool, Any]:
    """The value at a msgspec error path (`.inputs[0].shape[1]`) of a document.

    `document` is encoded bytes (decoded here, untyped) or Python values.
    """
    try:
        if isinstance(document, (bytes, bytearray, memoryview, msgspec.Raw)):
            value = (msgspec.msgpack.decode if fmt == "msgpack" else msgspec.json.decode)(document)
        else:
            value = document
        for key, index in _STEP.findall(path):
            value = value[int(index)] if index else value[key]
    except (*DECODE_ERRORS, LookupError, TypeError, ValueError):
        return False, None
    return True, value


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:] if text else text
