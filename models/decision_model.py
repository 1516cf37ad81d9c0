"""Write a copy of a GGUF as a decision model whose `systemone` template renders onepass's own prompt.

Usage: python models/decision_model.py SOURCE.gguf DEST.gguf [--temperature T]

T defaults to the source's calibration temperature when onepass knows the file (app/known_models.toml).

The copy carries what llama.cpp's server reads from a decision GGUF: `<arch>.decision.type` =
openjev (labels A-Z, a-z by option position, noul true first), a temperature per question type
(onepass's fitted calibration temperature for this model), and the template as
`tokenizer.chat_template.systemone`, listed in `tokenizer.chat_templates`. onepass serves it through
its decision path (app/answering/decision.py); llama.cpp's /v1/systemone could serve it too.

The prompt is onepass's: its system prompt, "Text:", the state, and each question in its block
(instructions, labelled options or levels, the answer line), in the model's chat turns. What the
format fixes differs: noul answers with the letters A (yes) and B (no) instead of Yes/No, score
levels with letters instead of digits from 1, and a choice's options keep the request's order.
The tensors are copied byte for byte; only metadata is added.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.answering.prompting import SYSTEM_PROMPT
from app.serving.known_models import identify, read_known_models

TYPE = "openjev"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def text(name: str, trim: bool = False) -> str:
    """A value as onepass writes it: a string as itself (a state trimmed), anything else as JSON."""
    shown = f"{name} | trim" if trim else name
    return f"{{% if {name} is string %}}{{{{ {shown} }}}}{{% else %}}{{{{ {name} | tojson }}}}{{% endif %}}"


def template() -> str:
    """The systemone template: onepass's state-first prompt, with openjev's letters. Templates render
    as chat templates do (trim_blocks: a newline right after a tag is dropped; the file's last
    newline too), so every newline after a tag is written as an expression."""
    nl = "{{ '\\n' }}"
    option = "{{ '" + LETTERS + "'[loop.index0] }}. "

    def block(default: str, heading: str, label: str, answer: str) -> str:
        return (
            "Question: {% if instructions %}"
            + text("instructions")
            + "{% else %}"
            + default
            + "{% endif %}"
            + nl
            + heading
            + nl
            + "{% for o in options %}"
            + option
            + label
            + nl
            + "{% endfor %}"
            + answer
        )

    described = "{% if o.description is not none %}: " + text("o.description") + "{% endif %}"
    return (
        "<|im_start|>system\n"
        + SYSTEM_PROMPT
        + "<|im_end|>\n<|im_start|>user\n"
        + "{% for image in images %}{{ image }}{% endfor %}"  # a request's images: before the state, as onepass's
        + "Text:\n"
        + text("state", trim=True)
        + nl
        + nl
        + "{% if type == 'noul' %}"
        + block(
            "Is this true of the text?",
            "Options:",
            "{{ 'Yes' if o.key == 'true' else 'No' }}" + described,
            "Answer with the label of one option",
        )
        + "{% elif type == 'choice' %}"
        + block(
            "Which option fits the text best?",
            "Options:",
            "{{ o.key }}" + described,
            "Answer with the label of one option",
        )
        + "{% else %}"
        + block(
            "Which level fits the text best?",
            "Levels, from lowest to highest:",
            text("o.description"),
            "Answer with the label of one level",
        )
        + "{% endif %}"
        + "<|im_end|>\n<|im_start|>assistant"
        + nl
    )


def convert(source: Path, dest: Path, temperature: float) -> None:
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    partial = dest.with_name(dest.name + ".partial")
    writer = gguf.GGUFWriter(partial, arch=arch, endianess=reader.endianess)
    alignment = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    # Written anew below (a file converted before has them already).
    added = {gguf.Keys.Tokenizer.CHAT_TEMPLATES, "tokenizer.chat_template.systemone"}
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or field.name in added:
            continue
        if field.name.startswith(f"{arch}.decision."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    writer.add_string(f"{arch}.decision.type", TYPE)
    for question_type in ("noul", "choice", "score"):
        writer.add_float32(f"{arch}.decision.temperature.{question_type}", temperature)
    writer.add_chat_template([{"name": "systemone", "template": template()}])
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    os.replace(partial, dest)  # whole or not at all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--temperature", type=float, help="every question type's temperature (default: see above)")
    args = parser.parse_args()
    temperature = args.temperature
    if temperature is None:
        known = identify(args.source, read_known_models())
        temperature = float(known.settings.get("calibration_temperature", 1.0)) if known is not None else 1.0
    convert(args.source, args.dest, temperature)
    print(f"wrote {args.dest} ({TYPE} decision model, temperature {temperature:g})")


if __name__ == "__main__":
    main()
