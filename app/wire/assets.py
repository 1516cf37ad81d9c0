"""A request's images, read off the wire: Jev's `assets` (base64 or a multipart part each) and
llama.cpp's forms (`files`/`images` data URLs, `image_url` parts of a state of chat messages), each
checked (app/wire/images.py) and put in prompt order in the request's Media.

Prompt order: llama.cpp's forms first, as its /v1/systemone loads them (`files`, `images`, then the
state's parts), then Jev's assets in the order their placeholders are first found in the state and
the questions' texts (SystemOneRequest.texts; an object's values in the order of its sorted keys, as
the prompt renders it). Every problem found is reported, each a 422 detail at its place.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.errors import InvalidRequest
from app.wire.contract import ImageAsset, SystemOneRequest, Text, errors_for_response, validation_error
from app.wire.images import MAX_BASE64_CHARS, MAX_IMAGES, Image, ImageRefused, Media, read_image
from app.wire.json_strings import map_strings

Loc = tuple[str | int, ...]
DATA_URL_FORM = "images are data URLs: data:image/...;base64,..."
# Base64 as MIME wraps it (RFC 2045: lines of at most 76 characters, each ended by CRLF) at the longest
# an image may be: longer text is refused before its whitespace is taken out.
MAX_BASE64_TEXT_CHARS = MAX_BASE64_CHARS + 2 * -(-MAX_BASE64_CHARS // 76)
# Every character str.isspace() holds for (what str.split() splits on), taken out by str.translate in one
# pass that makes no list of pieces.
_NO_WHITESPACE = dict.fromkeys(
    map(ord, "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"),
) | dict.fromkeys(range(0x2000, 0x200B))


@dataclass(frozen=True)
class _Source:
    """Where one image comes from: its place in the body, and a data URL or an asset."""

    loc: Loc
    url: Any = None  # a data URL, if it is one
    placeholder: str = ""
    asset: ImageAsset | None = None


class _Problems:
    """The 422 details found so far."""

    def __init__(self) -> None:
        self.details: list[dict[str, Any]] = []

    def add(self, loc: Loc, message: str, kind: str, value: Any) -> None:
        self.details += validation_error(loc, message, kind, value)


def request_of(payload: Any, parts: Mapping[str, bytes] | None = None) -> SystemOneRequest:
    """The contract's request from a parsed body and its multipart parts (none for a JSON body), its
    images read into its media; a 422 listing every problem otherwise."""
    sent = payload.get("assets") if isinstance(payload, dict) else None
    if isinstance(sent, dict):  # the count first, in the words of the full count below, before any is read
        _at_most_max_images([], list(sent))
    try:
        request = SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise InvalidRequest(errors_for_response(error)) from error
    parts = parts or {}
    state, message_images = _without_image_parts(request.state)
    if not (request.assets or request.images or request.files or message_images or parts):
        return request
    problems = _Problems()
    sources = [_Source(("files", i), url) for i, url in enumerate(request.files or [])]
    sources += [_Source(("images", i), url) for i, url in enumerate(request.images or [])]
    sources += [_Source(loc, url) for loc, url in message_images]
    _at_most_max_images(sources, list(request.assets or {}))
    sources += _assets_in_order(request, state, problems)
    images = [_image(source, parts, problems) for source in sources]
    _claimed_once(sources, parts, problems)
    if problems.details:
        raise InvalidRequest(problems.details)
    placeholders = tuple((s.placeholder, i) for i, s in enumerate(sources) if s.asset is not None)
    fields = tuple(dict.fromkeys(str(source.loc[0]) for source in sources))
    media = Media(tuple(image for image in images if image is not None), placeholders, fields)
    return request.carrying(state, media)


def _at_most_max_images(sources: list[_Source], placeholders: list[str]) -> None:
    """A 422 for more images than a request takes, counting every asset sent, before any text is searched
    for their placeholders: an asset beyond the limit can never be answered (too many images, or unused)."""
    count = len(sources) + len(placeholders)
    if count <= MAX_IMAGES:
        return
    extra = MAX_IMAGES - len(sources)
    loc = sources[MAX_IMAGES].loc if extra < 0 else ("assets", placeholders[extra])
    message = f"{count} images; a request takes at most {MAX_IMAGES}"
    raise InvalidRequest(validation_error(loc, message, "too_long", count))


def _without_image_parts(state: Text) -> tuple[Text, list[tuple[Loc, Any]]]:
    """The state without the `image_url` parts of its chat messages (a list of messages, or an object
    whose `messages` is one), as llama.cpp takes them out, and each part's URL with its place."""
    wrapped = isinstance(state, dict) and "messages" in state
    messages = state["messages"] if isinstance(state, dict) and wrapped else state
    if not isinstance(messages, list):
        return state, []
    found: list[tuple[Loc, Any]] = []
    kept_messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            kept_messages.append(message)
            continue
        content = []
        for j, part in enumerate(message["content"]):
            if isinstance(part, dict) and part.get("type") == "image_url" and "image_url" in part:
                url = part["image_url"]
                url = url["url"] if isinstance(url, dict) and "url" in url else url
                found.append((("state", *(("messages",) if wrapped else ()), i, "content", j), url))
            else:
                content.append(part)
        kept_messages.append({**message, "content": content})
    if not found:
        return state, []
    return ({**state, "messages": kept_messages} if isinstance(state, dict) else kept_messages), found


def _assets_in_order(request: SystemOneRequest, state: Text, problems: _Problems) -> list[_Source]:
    """The assets in the order their placeholders are first found; one found nowhere, or without its
    bytes, is a problem."""
    named: dict[str, ImageAsset] = {}
    for name, asset in (request.assets or {}).items():
        if not name:
            problems.add(("assets", name), "a placeholder is a non-empty string", "string_too_short", name)
        elif asset.part is None and asset.data_base64 is None:
            problems.add(("assets", name), "an image asset has data_base64 (with format) or part", "missing", None)
        elif asset.part is None and asset.format is None:
            problems.add(
                ("assets", name, "format"), "format (png, jpg or jpeg) comes with data_base64", "missing", None
            )
        else:
            named[name] = asset
    names = list(named)
    finder = Media(placeholders=tuple((name, i) for i, name in enumerate(names)))
    first: dict[int, None] = {}  # each asset's index, in the order first found

    def note(string: str) -> str:
        first.update(dict.fromkeys(finder.mentioned(string)))
        return string

    for text in itertools.chain([state], itertools.islice(request.texts(), 1, None)):  # the state without its parts
        map_strings(text, note, sort_keys=True)  # each string in the order the prompt renders it
    for i, name in enumerate(names):
        if i not in first:
            message = f"the placeholder {name!r} is found nowhere in the state, the instructions or the criteria"
            problems.add(("assets", name), message, "asset_unused", name)
    return [_Source(("assets", names[i]), placeholder=names[i], asset=named[names[i]]) for i in first]


def _image(source: _Source, parts: Mapping[str, bytes], problems: _Problems) -> Image | None:
    """The source's image, or None with its problem added."""
    asset, where = source.asset, ""
    try:
        if asset is None:
            data = _data_url(source.url)
        elif asset.part is not None:
            if asset.part not in parts:
                message = f"no part of the body is named {asset.part!r} (its parts: {', '.join(parts) or 'none'})"
                problems.add((*source.loc, "part"), message, "part_missing", asset.part)
                return None
            data, where = parts[asset.part], f"the part {asset.part!r}: "
        else:
            data = _base64(asset.data_base64 or "")
        return read_image(data)
    except ImageRefused as refused:
        problems.add(source.loc, where + refused.message, refused.kind, None)
        return None


def _data_url(url: Any) -> bytes:
    """The bytes of a data URL, as llama.cpp reads one: `data:image/<type>[;...];base64,<data>`."""
    if not isinstance(url, str):
        raise ImageRefused("data_url_invalid", DATA_URL_FORM)
    header, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma or "," in data:
        raise ImageRefused("data_url_invalid", DATA_URL_FORM)
    if not header.startswith("data:image/"):
        raise ImageRefused("data_url_invalid", f"{header[:40]!r}: only images are taken ({DATA_URL_FORM})")
    if not header.endswith("base64"):
        raise ImageRefused("data_url_invalid", f"the data URL is not base64 ({DATA_URL_FORM})")
    return _base64(data)


def _base64(text: str) -> bytes:
    """Standard base64, whitespace ignored (wrapped lines); too long is refused before it is decoded, and
    before its whitespace is taken out where even the room for line breaks cannot hold it."""
    if len(text) > MAX_BASE64_TEXT_CHARS:
        message = f"the image's base64 is {len(text)} characters with its whitespace; the limit is {MAX_BASE64_CHARS}"
        raise ImageRefused("image_too_large", message)
    compact = text.translate(_NO_WHITESPACE)
    if len(compact) > MAX_BASE64_CHARS:
        message = f"the image's base64 is {len(compact)} characters; the limit is {MAX_BASE64_CHARS}"
        raise ImageRefused("image_too_large", message)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImageRefused("base64_decode", f"the image is not valid base64: {error}") from error


def _claimed_once(sources: list[_Source], parts: Mapping[str, bytes], problems: _Problems) -> None:
    """Each part is the image of exactly one asset (as Jev has it: the SDK sends a part per placeholder)."""
    claims: dict[str, list[str]] = {}
    for source in sources:
        if source.asset is not None and source.asset.part is not None:
            claims.setdefault(source.asset.part, []).append(source.placeholder)
    for part, placeholders in claims.items():
        if len(placeholders) > 1:
            message = f"the part {part!r} is claimed by {len(placeholders)} assets; each part is one asset's"
            problems.add(("assets", placeholders[1], "part"), message, "part_reused", part)
    for part in parts:
        if part not in claims:
            problems.add((part,), f"no asset names the part {part!r}", "part_unclaimed", part)
