"""multipart/form-data bodies (RFC 7578), as typesafe-sdk sends a request with images: a `request`
part holding the JSON body, then a part per image. Strict and bounded: CRLF line ends, the
boundary from the Content-Type, an optional preamble and epilogue, quoted parameters, header names
in any case; at most 1 + 8 parts, each part's headers at most MAX_HEADER_BYTES, unique names, and
exactly one `request` part. Anything else is a 422 (`multipart_invalid`, `too_long` for too many
parts) naming what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.errors import InvalidRequest
from app.wire.images import MAX_IMAGES

REQUEST_PART = "request"
MAX_PARTS = 1 + MAX_IMAGES
MAX_HEADER_BYTES = 4096  # one part's header lines, together
# RFC 2046's boundary: 1 to 70 characters of these, not ending in a space.
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
# One `; name=value` parameter: a token, or a quoted string with backslash escapes.
_PARAMETER = re.compile(r';\s*([^\s=;"]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))\s*')


def invalid(message: str) -> InvalidRequest:
    return InvalidRequest.at((), message, "multipart_invalid", None)


def media_type(content_type: str) -> str:
    """A Content-Type's type and subtype, lower case."""
    return content_type.partition(";")[0].strip().lower()


def parameters(header: str) -> tuple[str, dict[str, str]]:
    """A header value's first word (lower case) and its parameters (names lower case, quotes undone)."""
    word, semicolon, rest = header.partition(";")
    found: dict[str, str] = {}
    rest = (semicolon + rest).rstrip().removesuffix(";")  # a trailing semicolon, as some clients send
    pos = 0
    while pos < len(rest):
        match = _PARAMETER.match(rest, pos)
        if match is None:
            raise invalid(f"cannot read the parameters of {header[:200]!r}")
        name = match[1].lower()
        if name in found:
            raise invalid(f"the parameter {name!r} is given twice in {header[:200]!r}")
        found[name] = re.sub(r"\\(.)", r"\1", match[2]) if match[2] is not None else match[3]
        pos = match.end()
    return word.strip().lower(), found


def boundary_of(content_type: str) -> bytes:
    boundary = parameters(content_type)[1].get("boundary")
    if boundary is None:
        raise invalid("a multipart/form-data body needs a boundary parameter in its Content-Type")
    if not _BOUNDARY.fullmatch(boundary):
        raise invalid(f"the boundary {boundary[:80]!r} is not 1 to 70 characters RFC 2046 allows")
    return boundary.encode("ascii")


@dataclass(frozen=True)
class Part:
    name: str
    data: bytes


def parse_multipart(body: bytes, content_type: str) -> list[Part]:
    """The parts of a multipart/form-data body, in order."""
    delimiter = b"--" + boundary_of(content_type)
    if body.startswith(delimiter):
        pos = 0
    else:  # a preamble, ended by a line break
        pos = body.find(b"\r\n" + delimiter)
        if pos < 0:
            raise invalid("the body holds no boundary line")
        pos += 2
    parts: list[Part] = []
    while True:
        pos += len(delimiter)
        if body.startswith(b"--", pos):  # the close delimiter; what follows is the epilogue
            return parts
        line_end = body.find(b"\r\n", pos)
        if line_end < 0 or body[pos:line_end].strip(b" \t"):
            raise invalid("a boundary line is not followed by a line break")
        if len(parts) == MAX_PARTS:
            message = f"more than {MAX_PARTS} parts: a request part and at most {MAX_IMAGES} images"
            raise InvalidRequest.at((), message, "too_long", None)
        if body.startswith(b"\r\n", line_end + 2):  # no header lines
            header_block, data_start = b"", line_end + 4
        else:
            headers_end = body.find(b"\r\n\r\n", line_end, line_end + 4 + MAX_HEADER_BYTES)
            if headers_end < 0:
                raise invalid(f"part {len(parts) + 1}'s headers do not end within {MAX_HEADER_BYTES} bytes")
            header_block, data_start = body[line_end + 2 : headers_end], headers_end + 4
        data_end = body.find(b"\r\n" + delimiter, data_start)
        if data_end < 0:
            raise invalid("the body ends before its closing boundary")
        parts.append(_part(header_block, body[data_start:data_end], len(parts) + 1))
        pos = data_end + 2


def _part(header_block: bytes, data: bytes, number: int) -> Part:
    try:
        lines = header_block.decode("utf-8").split("\r\n") if header_block else []
    except UnicodeDecodeError as error:
        raise invalid(f"part {number}'s headers are not UTF-8") from error
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or "\r" in line or "\n" in line:
            raise invalid(f"part {number} has a malformed header line {line[:100]!r}")
        if name.lower() in headers:
            raise invalid(f"part {number} has two {name} headers")
        headers[name.lower()] = value.strip()
    disposition = headers.get("content-disposition")
    if disposition is None:
        raise invalid(f"part {number} has no Content-Disposition header")
    kind, found = parameters(disposition)
    if kind != "form-data" or not found.get("name"):
        raise invalid(f"part {number}'s Content-Disposition is not form-data with a name")
    return Part(found["name"], data)


def request_and_images(parts: list[Part]) -> tuple[bytes, dict[str, bytes]]:
    """The `request` part's bytes, and every other part's by its name."""
    names = [part.name for part in parts]
    for name in names:
        if names.count(name) > 1:
            raise invalid(f"two parts are named {name!r}; each part has its own name")
    if REQUEST_PART not in names:
        raise invalid(f"no part is named {REQUEST_PART!r}: it holds the JSON body")
    by_name = {part.name: part.data for part in parts}
    return by_name.pop(REQUEST_PART), by_name
