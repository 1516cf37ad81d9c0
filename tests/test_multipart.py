"""app/http/multipart.py: the bodies typesafe-sdk, curl and browsers send are read part by part; every
malformed one is a 422 multipart_invalid saying what is wrong, and nothing else ever escapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typesafe_sdk._core.multipart import Part as SdkPart
from typesafe_sdk._core.multipart import encode_multipart

from app.errors import InvalidRequest
from app.http.multipart import MAX_HEADER_BYTES, Part, parameters, parse_multipart, request_and_images

B = "0123456789abcdef0123456789abcdef"
CT = f"multipart/form-data; boundary={B}"


def part(name: str, data: bytes, extra: str = "") -> bytes:
    return f'--{B}\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n'.encode() + data + b"\r\n"


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{B}--\r\n".encode()


def problem(raw: bytes, content_type: str = CT, kind: str = "multipart_invalid") -> str:
    with pytest.raises(InvalidRequest) as raised:
        request_and_images(parse_multipart(raw, content_type))
    [detail] = raised.value.details
    assert (detail["loc"], detail["type"]) == (["body"], kind)
    return str(detail["msg"])


def test_the_sdks_own_encoding_is_read_back_part_for_part() -> None:
    image = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 3 + b"\r\n--not-the-boundary\r\n"
    content_type, raw = encode_multipart(
        [
            SdkPart("request", "application/json", b'{"state": "x"}'),
            SdkPart("asset-0", "image/png", image, "asset-0"),
            SdkPart("asset-1", "application/octet-stream", b"", "asset-1"),
        ]
    )
    parts = parse_multipart(raw, content_type)
    assert parts == [Part("request", b'{"state": "x"}'), Part("asset-0", image), Part("asset-1", b"")]
    assert request_and_images(parts) == (b'{"state": "x"}', {"asset-0": image, "asset-1": b""})


def test_a_preamble_an_epilogue_quoted_parameters_and_header_names_in_any_case_are_read() -> None:
    raw = (
        b"This is the preamble.\r\n"
        + f'--{B}\r\ncontent-DISPOSITION: Form-Data; filename="a;b.png"; NAME="asset \\"0\\""\r\n'.encode()
        + b"CONTENT-TYPE: image/png\r\nX-Other: ignored\r\n\r\npixels\r\n"
        + f"--{B}  \r\ncontent-disposition: form-data; name=request;\r\n\r\n{{}}\r\n--{B}--".encode()
        + b"\r\nThis is the epilogue, \r\n--with a dash line.\r\n"
    )
    parts = parse_multipart(raw, f'Multipart/Form-Data; charset=utf-8; boundary="{B}"')
    assert parts == [Part('asset "0"', b"pixels"), Part("request", b"{}")]


def test_parameters_are_read_as_rfc_2045_writes_them() -> None:
    assert parameters("form-data; name=\"a\\\\b\"; filename*=UTF-8''x.png") == (
        "form-data",
        {"name": "a\\b", "filename*": "UTF-8''x.png"},
    )


MALFORMED: dict[str, tuple[bytes, str, str]] = {
    "no boundary parameter": (
        body(part("request", b"{}")),
        "multipart/form-data",
        "a multipart/form-data body needs a boundary parameter in its Content-Type",
    ),
    "a boundary of 71 characters": (body(), "multipart/form-data; boundary=" + "a" * 71, "the boundary 'aaaa"),
    "a boundary parameter given twice": (
        body(),
        f"multipart/form-data; boundary={B}; boundary=x",
        "the parameter 'boundary' is given twice",
    ),
    "unreadable parameters": (body(), 'multipart/form-data; boundary="unclosed', "cannot read the parameters of"),
    "no boundary line": (b'{"state": "x"}', CT, "the body holds no boundary line"),
    "LF line ends": (
        body(part("request", b"{}")).replace(b"\r\n", b"\n"),
        CT,
        "a boundary line is not followed by a line break",
    ),
    "no closing boundary": (part("request", b"{}"), CT, "the body ends before its closing boundary"),
    "junk after a boundary": (
        f"--{B}junk\r\n".encode() + body(part("request", b"{}")),
        CT,
        "a boundary line is not followed by a line break",
    ),
    "headers that never end": (
        f"--{B}\r\nContent-Disposition: form-data; name=request\r\n".encode() + b"X: " + b"y" * MAX_HEADER_BYTES,
        CT,
        f"part 1's headers do not end within {MAX_HEADER_BYTES} bytes",
    ),
    "a header line without a colon": (
        body(f"--{B}\r\nContent-Disposition form-data\r\n\r\n{{}}\r\n".encode()),
        CT,
        "part 1 has a malformed header line 'Content-Disposition form-data'",
    ),
    "a folded header line": (
        body(f"--{B}\r\nContent-Disposition: form-data;\r\n name=request\r\n\r\n{{}}\r\n".encode()),
        CT,
        "part 1 has a malformed header line ' name=request'",
    ),
    "headers that are not UTF-8": (
        body(f"--{B}\r\nContent-Disposition: form-data; name=".encode() + b"\xff\r\n\r\n{}\r\n"),
        CT,
        "part 1's headers are not UTF-8",
    ),
    "no Content-Disposition": (
        body(f"--{B}\r\nContent-Type: application/json\r\n\r\n{{}}\r\n".encode()),
        CT,
        "part 1 has no Content-Disposition header",
    ),
    "a part with no headers": (body(f"--{B}\r\n\r\n{{}}\r\n".encode()), CT, "part 1 has no Content-Disposition header"),
    "two Content-Disposition headers": (
        body(part("request", b"{}", '\r\nContent-Disposition: form-data; name="x"')),
        CT,
        "part 1 has two Content-Disposition headers",
    ),
    "attachment, not form-data": (
        body(f'--{B}\r\nContent-Disposition: attachment; name="request"\r\n\r\n{{}}\r\n'.encode()),
        CT,
        "part 1's Content-Disposition is not form-data with a name",
    ),
    "a part without a name": (
        body(f'--{B}\r\nContent-Disposition: form-data; filename="a.png"\r\n\r\n{{}}\r\n'.encode()),
        CT,
        "part 1's Content-Disposition is not form-data with a name",
    ),
    "two parts of one name": (
        body(part("request", b"{}"), part("asset-0", b"a"), part("asset-0", b"b")),
        CT,
        "two parts are named 'asset-0'; each part has its own name",
    ),
    "two request parts": (
        body(part("request", b"{}"), part("request", b"{}")),
        CT,
        "two parts are named 'request'; each part has its own name",
    ),
    "no request part": (body(part("asset-0", b"a")), CT, "no part is named 'request': it holds the JSON body"),
    "no parts at all": (body(), CT, "no part is named 'request': it holds the JSON body"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_body_says_what_is_wrong(name: str) -> None:
    raw, content_type, message = MALFORMED[name]
    assert problem(raw, content_type).startswith(message)


def test_ten_parts_are_too_many() -> None:
    raw = body(part("request", b"{}"), *(part(f"asset-{i}", b"x") for i in range(9)))
    assert problem(raw, kind="too_long") == "more than 9 parts: a request part and at most 8 images"
    assert len(parse_multipart(body(part("request", b"{}"), *(part(f"asset-{i}", b"x") for i in range(8))), CT)) == 9


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    pieces=st.lists(
        st.sampled_from([b"\r\n", b"--", B.encode(), b'Content-Disposition: form-data; name="', b'"', b"request"])
        | st.binary(max_size=12),
        max_size=30,
    ),
)
def test_any_bytes_are_parts_or_a_422_never_another_error(data: st.DataObject, pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    content_type = data.draw(st.sampled_from([CT, f'multipart/form-data; boundary="{B}"', "multipart/form-data; b"]))
    try:
        request_and_images(parse_multipart(raw, content_type))
    except InvalidRequest as error:
        assert error.details[0]["type"] in ("multipart_invalid", "too_long")


@settings(max_examples=200, deadline=None)
@given(
    # Any name UTF-8 can carry (a lone surrogate cannot be encoded, by the SDK or anyone).
    names=st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters='"\\\r\n\x00'), min_size=1, max_size=8), max_size=8
    ),
    contents=st.lists(st.binary(max_size=40), min_size=8, max_size=8),
)
def test_what_the_sdk_encodes_is_read_back_whatever_the_names_and_bytes(
    names: list[str], contents: list[bytes]
) -> None:
    named = dict.fromkeys(name for name in names if name != "request")
    encoded = [
        SdkPart("request", "application/json", b"{}"),
        *(SdkPart(n, "x/y", c, n) for n, c in zip(named, contents, strict=False)),
    ]
    content_type, raw = encode_multipart(encoded)
    assert request_and_images(parse_multipart(raw, content_type)) == (b"{}", dict(zip(named, contents, strict=False)))
