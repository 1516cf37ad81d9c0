"""Text as the page shows it: a request as a curl command, a response as its status line, headers and
JSON laid out for reading, and what of it is the same from run to run (`normalised`)."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

# Characters a line of JSON takes, numbers and ids counted as placeholders, before its items go one a line
# (FLAT_WIDTH: an object or array of plain values, such as timings, kept whole for longer).
WIDTH = 110
FLAT_WIDTH = 160
BOUNDARY = "------------------------d74496d66958873e"  # curl's kind of boundary

NUMBER_WITH_FRACTION = re.compile(r"(?<![\w.])-?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)(?![\w.])")
HEX_ID = re.compile(r"(?<![\w.])[0-9a-f]{16,}(?![\w.])")


def normalised(text: str) -> str:
    """What is the same from run to run: hex ids and numbers with a fraction or an exponent, as placeholders
    (timings, probabilities and scores come from a model with random weights and rounding that depends on
    the CPU; job and fit ids and content keys differ on every run)."""
    return NUMBER_WITH_FRACTION.sub("<number>", HEX_ID.sub("<hex>", text))


def layout(value: Any, indent: int = 0, before: int = 0) -> str:
    """JSON as the page shows it: a value on one line where it fits in WIDTH (`before`: the characters
    ahead of it on its line), else one item a line. Measured as `normalised`, so that the lines break at
    the same places whatever the digits of a run."""
    compact = json.dumps(value, ensure_ascii=False)
    items = list(value.values() if isinstance(value, dict) else value) if isinstance(value, dict | list) else []
    width = WIDTH if any(isinstance(item, dict | list) for item in items) else FLAT_WIDTH
    if not items or 2 * indent + before + len(normalised(compact)) <= width:
        return compact
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        keys = {k: json.dumps(k, ensure_ascii=False) + ": " for k in value}
        items = [pad + keys[k] + layout(v, indent + 1, len(keys[k])) for k, v in value.items()]
    else:
        items = [pad + layout(v, indent + 1) for v in value]
    opening, closing = "{}" if isinstance(value, dict) else "[]"
    return opening + "\n" + ",\n".join(items) + "\n" + "  " * indent + closing


def block(text: str, kind: str = "") -> str:
    return f"```{kind}\n{text}\n```\n"


def json_block(value: Any) -> str:
    return block(layout(value), "json")


def blocks(*parts: str) -> str:
    """Code blocks and lines of text, a blank line between each two."""
    return "\n".join(parts)


def curl(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, *, show: bool = False) -> str:
    """The request as a curl command (`show`: -i, the status line and headers too)."""
    words = ["curl -s" + (" -i" if show else "")]
    if method not in ("GET", "POST") or (method == "POST" and body is None):
        words.append(f"-X {method}")
    words.append(shlex.quote(f"localhost:8080{path}"))
    words += [f"-H {shlex.quote(f'{name}: {value}')}" for name, value in (headers or {}).items()]
    if isinstance(body, str):
        words.append(f"--data-binary @{body}")
    elif body is not None:
        words.append("-d '" + layout(body).replace("'", "'\\''") + "'")
    return " ".join(words)


def curl_form(fields: list[tuple[str, str, str, bytes]]) -> tuple[str, bytes]:
    """What `curl -F name=@file;type=...` sends for (name, file name, type, bytes) each: its Content-Type and body."""
    body = b""
    for name, filename, kind, data in fields:
        disposition = f'Content-Disposition: form-data; name="{name}"; filename="{filename}"'
        body += f"--{BOUNDARY}\r\n{disposition}\r\nContent-Type: {kind}\r\n\r\n".encode() + data + b"\r\n"
    return f"multipart/form-data; boundary={BOUNDARY}", body + f"--{BOUNDARY}--\r\n".encode()


def head(response: Any) -> str:
    """The status line and the headers, as curl -i shows them (the length aside: it follows the numbers)."""
    lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}"]
    lines += [f"{name}: {value}" for name, value in response.headers.items() if name != "content-length"]
    return "\n".join(lines)


def clipped(value: Any, keep: int = 3) -> Any:
    """`value` with every array of more than `keep` + 1 items cut to its first `keep` and "..."."""
    if isinstance(value, dict):
        return {k: clipped(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) <= keep + 1:
            return [clipped(v, keep) for v in value]
        return [*(clipped(v, keep) for v in value[:keep]), "..."]
    return value


def shortened(job: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """A batch job with only the results at `keep`."""
    return {**job, "results": [job["results"][i] for i in keep]}
