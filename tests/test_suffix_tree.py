"""The suffix tree's rows and the decode plan: pure Python, no llama.cpp."""

from __future__ import annotations

from itertools import pairwise

import pytest

from app.engine.suffix_tree import MAX_SEQUENCES, plan_groups, suffix_rows


def test_suffix_rows_decode_the_tokens_suffixes_begin_with_once() -> None:
    suffixes = [[7, 8, 9], [7, 8, 4], [7, 5], [7, 8], [6]]
    rows, paths = suffix_rows(suffixes, 100)
    assert rows == [
        (7, 100, (1, 2, 3, 4), False),
        (8, 101, (1, 2, 4), True),  # suffix 4 ends here: its logits are read from the shared row
        (9, 102, (1,), True),
        (4, 102, (2,), True),
        (5, 101, (3,), True),
        (6, 100, (5,), True),
    ]
    assert paths == [[0, 1, 2], [0, 1, 3], [0, 4], [0, 1], [5]]  # each token's row: a mark reads any of them
    whole, whole_paths = suffix_rows(suffixes, 100, share=False)
    assert [row[2] for row in whole] == [(1,)] * 3 + [(2,)] * 3 + [(3,)] * 2 + [(4,)] * 2 + [(5,)]
    assert [path[-1] for path in whole_paths] == [2, 5, 7, 9, 10]


def test_each_sequences_positions_rise_and_its_rows_only_narrow() -> None:
    """What llama.cpp requires of a batch that puts a row in several sequences."""
    suffixes = [[1, 2, 3, 4], [1, 2, 5], [1, 6, 7, 8, 9], [1, 2, 3, 10], [11]]
    rows, paths = suffix_rows(suffixes, 40)
    for seq, path in enumerate(paths, start=1):
        assert [rows[row][0] for row in path] == suffixes[seq - 1]  # the suffix's own tokens, in order
        assert [rows[row][1] for row in path] == list(range(40, 40 + len(path)))
        assert all(seq in rows[row][2] for row in path)
        assert all(set(rows[b][2]) <= set(rows[a][2]) for a, b in pairwise(path))
    assert sum(row[3] for row in rows) == len(suffixes)  # logits at each suffix's last row only


def test_the_plan_fills_each_decode_up_to_the_sequences_and_the_free_cells() -> None:
    assert plan_groups(10_000, [3] * 300) == [list(range(MAX_SEQUENCES - 1)), list(range(MAX_SEQUENCES - 1, 300))]
    assert plan_groups(10, [4, 4, 4]) == [[0, 1], [2]]
    assert plan_groups(10, []) == []
    with pytest.raises(ValueError, match="suffix 0 has 5 tokens; 2 cells are free after the prefix"):
        plan_groups(2, [5])
    with pytest.raises(ValueError, match="suffix 1 has 0 tokens"):
        plan_groups(10, [1, 0])
