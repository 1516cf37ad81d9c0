"""Request bodies: read within a size limit, Content-Encoding (zstd, gzip) undone, then strict JSON,
or multipart/form-data whose `request` part is (app/http/multipart.py)."""

from __future__ import annotations

import json
import math
import re
import zlib
from typing import Any

from starlette.requests import Request

from app.errors import ApiError, InvalidRequest
from app.http.multipart import media_type, parse_multipart, request_and_images

try:  # the official SDK compresses bodies with zstd when it can
    from compression.zstd import ZstdDecompressor  # type: ignore[import-not-found]
except ImportError:
    from backports.zstd import ZstdDecompressor


def too_large(limit: int, what: str = "the body") -> ApiError:
    return ApiError(413, "request_too_large", f"{what} exceeds the limit of {limit} bytes")


def decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent before compression; a decompression bomb stops at limit + 1 bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("zstd", "gzip"):
        raise ApiError(415, "unsupported_media_type", f"Content-Encoding {encoding!r} is not supported")
    try:
        if encoding == "zstd":
            decoded: bytes = ZstdDecompressor().decompress(body, max_length=limit + 1)
        else:
            decoded = zlib.decompressobj(wbits=31).decompress(body, limit + 1)
    except Exception as error:
        raise InvalidRequest.at((), f"body could not be decompressed: {error}", "value_error", None) from error
    if len(decoded) > limit:
        raise too_large(limit, "the decompressed body")
    return decoded


async def read_body(request: Request, limit: int) -> bytes:
    """The body, decoded, or a 413 as soon as it (or what it decompresses to) passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, f"the body of {declared} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return decode_content(b"".join(chunks), request.headers.get("content-encoding", "identity"), limit)


MAX_DEPTH = 64  # objects and arrays nested deeper than this are rejected, before any recursion can fail
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone "\\ud800" escape parses, but is not text UTF-8 can hold


class _Refused(ValueError):
    """A token json.loads read and we refuse. Its hooks are given the token's text, not where it stands."""

    def __init__(self, token: str, why: str) -> None:
        super().__init__(why)
        self.token = token


def _reject_constant(name: str) -> None:
    raise _Refused(name, f"{name} is not valid JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999 parses to infinity
        raise _Refused(text, f"the number {text[:40]} is out of range (it would be {number})")
    return number


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError as error:  # more digits than Python converts
        raise _Refused(text, str(error)) from None


_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'  # unrolled: a run of plain characters at a time


def _where(body: bytes, token: str) -> int:
    """Where `token` first stands outside a string, counted in the decoded text as JSONDecodeError counts:
    where json.loads, reading left to right, refused it."""
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    for match in re.finditer(rf"{_STRING}|(?<![\w.+-]){re.escape(token)}(?![\w.])", text):
        if not match.group().startswith('"'):
            return match.start()
    return 0


def _invalid(loc: list[Any], msg: str, error_type: str, ctx: str) -> InvalidRequest:
    return InvalidRequest([{"loc": loc, "msg": msg, "type": error_type, "input": {}, "ctx": {"error": ctx}}])


def _printable(key: str) -> str:
    """A key for an error's loc: lone surrogates shown as \\udXXX escapes, since they cannot be sent as UTF-8."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def check_tree(value: Any) -> None:
    """Depth within MAX_DEPTH and every string (keys too) valid Unicode text, or a 422 naming the place.

    Iterative, so a deep body cannot exhaust the stack here either.
    """
    stack: list[tuple[Any, int, list[Any]]] = [(value, 0, ["body"])]
    while stack:
        item, depth, loc = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _invalid(loc, "string holds a lone UTF-16 surrogate", "string_unicode", "not valid UTF-8 text")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= MAX_DEPTH:
            raise _invalid(loc, f"JSON nested deeper than {MAX_DEPTH} levels", "json_too_deep", f"limit {MAX_DEPTH}")
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise _invalid(
                    [*loc, _printable(key)],
                    "key holds a lone UTF-16 surrogate",
                    "string_unicode",
                    "not valid UTF-8 text",
                )
            stack.append((child, depth + 1, [*loc, key]))


def parse_json(body: bytes) -> Any:
    """JSON as RFC 8259 has it, as text the tokenizer can take: NaN, Infinity and numbers out of a
    double's range are rejected, as are lone surrogates and nesting deeper than MAX_DEPTH."""
    try:
        payload = json.loads(body, parse_constant=_reject_constant, parse_float=_finite, parse_int=_integer)
    except RecursionError as error:  # deeper than the interpreter's stack: far past MAX_DEPTH
        raise _invalid(["body"], f"JSON nested deeper than {MAX_DEPTH} levels", "json_too_deep", str(error)) from error
    except _Refused as error:
        raise _invalid(["body", _where(body, error.token)], "JSON decode error", "json_invalid", str(error)) from error
    except ValueError as error:  # a syntax error (it knows its place), or UnicodeDecodeError
        raise _invalid(["body", getattr(error, "pos", 0)], "JSON decode error", "json_invalid", str(error)) from error
    check_tree(payload)
    return payload


def parse_payload(body: bytes, content_type: str) -> tuple[Any, dict[str, bytes]]:
    """The JSON of a body, and its image parts by name: a multipart/form-data body's JSON is its
    `request` part; any other body is JSON whatever its Content-Type says (and has no parts)."""
    if media_type(content_type) != "multipart/form-data":
        return parse_json(body), {}
    request, parts = request_and_images(parse_multipart(body, content_type))
    return parse_json(request), parts
