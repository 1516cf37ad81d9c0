"""Which batch rows decode a request's question suffixes, and how many decodes they take: pure Python.

After the prefix in sequence 0, suffix i is decoded in sequence i + 1. Tokens that several suffixes
begin with ("Question: Does the ...") form a tree and are decoded once, in all of their sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ; sequence 0 holds the prefix

Row = tuple[int, int, tuple[int, ...], bool]  # a batch row: token, position, sequences, wants logits


def suffix_rows(
    suffixes: Sequence[Sequence[int]], n_prefix: int, *, share: bool = True
) -> tuple[list[Row], list[list[int]]]:
    """The batch rows that decode `suffixes` (token lists) after an `n_prefix`-token prefix, suffix i
    in sequence i + 1, and the row of each of each suffix's tokens.

    With `share`, the suffixes form a tree: a token that several suffixes reach through the same
    tokens is one row, in all of their sequences (llama.cpp masks a row by its first sequence,
    whose earlier tokens are exactly the shared ones). Rows go depth first, so each sequence's
    positions rise and its set of sequences only narrows, as llama.cpp requires.
    """
    # Node 0 is the prefix; each node has its token, the sequences through it and its children.
    tokens: list[int] = [-1]
    sequences: list[list[int]] = [[]]
    children: list[dict[tuple[int, int], int]] = [{}]  # by (token, 0), or (token, suffix) when not sharing
    paths: list[list[int]] = []  # each suffix's nodes, one per token
    for seq, suffix in enumerate(suffixes, start=1):
        node = 0
        paths.append([])
        for token in suffix:
            key = (token, 0 if share else seq)
            if key not in children[node]:
                children[node][key] = len(tokens)
                tokens.append(token)
                sequences.append([])
                children.append({})
            node = children[node][key]
            sequences[node].append(seq)
            paths[-1].append(node)
    outputs = {path[-1] for path in paths}
    rows: list[Row] = []
    row_of: dict[int, int] = {}
    stack = [(child, 0) for child in reversed(children[0].values())]
    while stack:
        node, depth = stack.pop()
        row_of[node] = len(rows)
        rows.append((tokens[node], n_prefix + depth, tuple(sequences[node]), node in outputs))
        stack.extend((child, depth + 1) for child in reversed(children[node].values()))
    return rows, [[row_of[node] for node in path] for path in paths]


def plan_groups(free_cells: int, suffix_lengths: Sequence[int]) -> list[list[int]]:
    """Suffix indices per decode: in order, each group as large as the sequence limit and the
    `free_cells` after the prefix allow.

    Suffixes count whole: shared tokens make a group's rows fewer, never more."""
    groups: list[list[int]] = []
    used = 0
    for i, length in enumerate(suffix_lengths):
        if length < 1 or length > free_cells:
            raise ValueError(f"suffix {i} has {length} tokens; {free_cells} cells are free after the prefix")
        if not groups or len(groups[-1]) == MAX_SEQUENCES - 1 or used + length > free_cells:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += length
    return groups
