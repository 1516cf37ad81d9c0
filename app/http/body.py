"""Request bodies: read within a size limit, Content-Encoding (zstd, gzip) undone, then strict JSON,
or multipart/form-data whose `request` part is (app/http/multipart.py).

`read_request` is every route's one reader: on the event loop it only receives the body's bytes
(within the limit); undoing the encoding, parsing and the route's own reading of the payload run
in one worker thread, so a large body never stalls the loop (and /health with it)."""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
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


async def _received(request: Request, limit: int) -> list[bytes]:
    """The body's chunks as they arrive, or a 413 as soon as they pass `limit` bytes. On the loop, so
    nothing here copies or looks into them."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, f"the body of {declared} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return chunks


Read = TypeVar("Read")


async def read_request(
    request: Request, limit: int, then: Callable[[Any, dict[str, bytes]], Read], *, multipart: bool = False
) -> Read:
    """What `then(payload, parts)` makes of the request's body: the body received within `limit` bytes
    on the loop, then, in ONE worker thread call, joined, its Content-Encoding undone (a 413 as soon
    as it decompresses past `limit`), parsed as strict JSON (with `multipart`, a multipart/form-data
    body's `request` part, its image parts in `parts`; else any body is JSON and `parts` is empty),
    and read by `then` (validation, images)."""
    chunks = await _received(request, limit)
    encoding = request.headers.get("content-encoding", "identity")
    content_type = request.headers.get("content-type", "") if multipart else ""

    def read() -> Read:
        body = b"".join(chunks)
        chunks.clear()  # the joined copy is all that is kept of a body that may be a hundred MB
        payload, parts = parse_payload(decode_content(body, encoding, limit), content_type)
        return then(payload, parts)

    return await anyio.to_thread.run_sync(read)


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


def _object(value: dict[str, Any]) -> dict[str, Any]:
    """Every object as parsed. Being Python, the call is a point where the thread parsing a large body
    lets others run: json's C scanner otherwise holds the GIL, and so stalls the event loop, until the
    whole body is parsed (numbers have such points already, in their hooks)."""
    return value


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

    Iterative, so a deep body cannot exhaust the stack here either. A container's children are walked
    last first, each wholly before the one before it, and the place is built only for an error: the
    walk holds one iterator per open container, not a place per value, so a body of a million values
    leaves nothing for the garbage collector to scan (its pauses stop every thread, the loop's too).
    """
    loc: list[Any] = ["body"]  # the place of `item`; each open container adds its child's key
    open_children: list[Iterator[tuple[Any, Any]]] = []  # per open container, its children not yet walked
    item = value
    while True:
        if isinstance(item, str) and _SURROGATE.search(item):
            raise _invalid(list(loc), "string holds a lone UTF-16 surrogate", "string_unicode", "not valid UTF-8 text")
        if isinstance(item, dict | list):
            if len(open_children) >= MAX_DEPTH:
                limit = f"limit {MAX_DEPTH}"
                raise _invalid(list(loc), f"JSON nested deeper than {MAX_DEPTH} levels", "json_too_deep", limit)
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str) and _SURROGATE.search(key):
                        message = "key holds a lone UTF-16 surrogate"
                        raise _invalid([*loc, _printable(key)], message, "string_unicode", "not valid UTF-8 text")
                open_children.append(reversed(item.items()))
            else:
                open_children.append(zip(range(len(item) - 1, -1, -1), reversed(item), strict=True))
            loc.append(None)  # the key of the child being walked
        while open_children:  # the next value: the innermost open container's next child
            child = next(open_children[-1], None)
            if child is not None:
                loc[-1], item = child
                break
            open_children.pop()
            loc.pop()
        else:
            return


def parse_json(body: bytes) -> Any:
    """JSON as RFC 8259 has it, as text the tokenizer can take: NaN, Infinity and numbers out of a
    double's range are rejected, as are lone surrogates and nesting deeper than MAX_DEPTH."""
    try:
        payload = json.loads(
            body, object_hook=_object, parse_constant=_reject_constant, parse_float=_finite, parse_int=_integer
        )
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
