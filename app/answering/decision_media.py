"""A decision prompt's images, put where llama.cpp's server puts them (tools/server/server-decision.cpp
and process_mtmd_prompt in server-common.cpp), for the types it gives images: openjev, pplx-decider,
lfm2-d1, clef and lfm2-d1-omni.

The template is given `images`, one media marker per image, and the marker is blanked out of every
user string. libmtmd then splits the rendered prompt at the markers, tokenizes each text piece on its
own (special tokens parsed, no BOS), puts each image's projector text and cells in place of its
marker, and, since the server asks for special tokens, begins the prompt with BOS only where the
vocabulary adds one and ends it with EOS only where the vocabulary adds one. Without images the
server tokenizes the prompt whole, with neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.answering.decision_text import replace_text
from app.answering.prompter import TemplateRefused
from app.engine.snapshot import IMAGE_CELL, ImageSpan
from app.engine.vision import MEDIA_MARKER, ImageTokens, ImageUnreadable, Vision
from app.wire.contract import SystemOneRequest
from app.wire.images import Media

IMAGE_TYPES = ("openjev", "clef", "pplx-decider", "lfm2-d1", "lfm2-d1-omni")  # server-decision.h can_use_images


class PromptImages:
    """A decision model's way of putting images in its prompts."""

    def __init__(
        self,
        kind: str,
        vision: Vision | None,
        tokenize: Callable[[str], tuple[int, ...]],
        bos: int | None,
        eos: int | None,
    ) -> None:
        """`tokenize`: a text piece's tokens (special tokens parsed, no BOS); `bos`, `eos`: the tokens
        the vocabulary adds at a prompt's ends (None: it adds none)."""
        self.kind = kind
        self.vision = vision
        self._tokenize = tokenize
        self._bos, self._eos = bos, eos

    def read(self, request: SystemOneRequest) -> tuple[ImageTokens, ...]:
        """What each of the request's images puts in a prompt, in order; a 422 where the model takes none."""
        media = request.media
        if not media.images:
            return ()
        loc = (media.fields[0],)
        if self.kind not in IMAGE_TYPES:
            message = (
                f"llama.cpp gives a {self.kind} decision model no images; the decision types that take them: "
                + ", ".join(IMAGE_TYPES)
            )
            raise TemplateRefused(loc, message, "images_unsupported")
        if self.vision is None:
            raise TemplateRefused(loc, "this model has no vision projector: it takes no images", "images_unsupported")
        found = []
        for image in media.images:
            try:
                found.append(self.vision.tokens(image.data, image.sha256))
            except ImageUnreadable as error:
                raise TemplateRefused(loc, str(error), error.kind) from error
        return tuple(found)

    @staticmethod
    def values(media: Media, values: dict[str, Any], n_images: int) -> dict[str, Any]:
        """A template's values with its images: Jev placeholders dropped (the images come where the
        template puts them), the media marker blanked out of every string, one marker per image."""
        values = media.substitute(values, lambda _: "")
        if n_images:
            values = replace_text(values, MEDIA_MARKER, " ")
        values["images"] = [MEDIA_MARKER] * n_images
        return values

    def tokens(self, prompt: str, images: Sequence[ImageTokens]) -> tuple[list[int], list[ImageSpan]]:
        """A rendered prompt's tokens, each image's cells IMAGE_CELL, and the images' spans. A template
        that does not put each image in its prompt is refused at the images (an empty `loc`)."""
        pieces = prompt.split(MEDIA_MARKER)
        if len(pieces) != len(images) + 1:
            message = f"the model's template put {len(pieces) - 1} of the request's {len(images)} images in its prompt"
            raise TemplateRefused((), message)
        cells: list[int] = [self._bos] if self._bos is not None else []
        spans: list[ImageSpan] = []
        for piece, image in zip(pieces, images, strict=False):
            cells += self._tokenize(piece) if piece else ()
            cells += image.before
            spans.append(ImageSpan(len(cells), image.sha256, image.n_tokens, image.n_pos))
            cells += [IMAGE_CELL] * image.n_tokens
            cells += image.after
        cells += self._tokenize(pieces[-1]) if pieces[-1] else ()
        if self._eos is not None:
            cells.append(self._eos)
        return cells, spans


def described(spans: Sequence[ImageSpan]) -> tuple[str, ...]:
    """What a prefix's images add to its cache key: each one's file, cells and positions, in order."""
    return tuple(f"image {s.sha256} {s.n_tokens} {s.n_pos}" for s in spans)
