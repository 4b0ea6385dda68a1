"""Tiny LEAF FEMNIST files in LEAF's real on-disk format: ``<root>/femnist/data/{train,test}/*.json`` as
LEAF's ``preprocess.sh -t sample`` writes them (users, num_samples, user_data with x: 784 pixels k / 255, y: 0..61).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# writer -> (training samples, test samples); "f0003_41" has no test samples, as a writer may
WRITERS = {"f0000_14": (5, 2), "f0001_41": (3, 1), "f0002_09": (4, 2), "f0003_41": (2, 0), "f0004_27": (6, 1)}


def writer_data(index: int, count: int, offset: int) -> dict:
    """``count`` images whose pixels are k / 255 (as LEAF writes them) and labels 0..61, distinct per writer."""
    rng = np.random.default_rng(100 * index + offset)
    pixels = rng.integers(0, 256, size=(count, 784)) / 255
    labels = rng.integers(0, 62, size=count)
    return {"x": pixels.tolist(), "y": labels.tolist()}


def write_femnist(root: Path, writers: dict[str, tuple[int, int]] = WRITERS, per_file: int = 2) -> dict:
    """LEAF's files for ``writers``, ``per_file`` writers to a file (LEAF's names); their data by split."""
    written: dict[str, dict] = {"train": {}, "test": {}}
    names = list(writers)
    for split, column in (("train", 0), ("test", 1)):
        folder = root / "femnist" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        for j, start in enumerate(range(0, len(names), per_file)):
            users = [u for u in names[start:start + per_file] if writers[u][column] > 0]
            data = {u: writer_data(names.index(u), writers[u][column], column) for u in users}
            written[split].update(data)
            body = {"users": users, "num_samples": [writers[u][column] for u in users], "user_data": data}
            (folder / f"all_data_{j}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(body))
    return written


# LEAF's 80-character vocabulary (models/utils/language_utils.py, ALL_LETTERS), written out here as LEAF has it
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
# speaking role -> (training samples, test samples), as LEAF names roles: play and character
ROLES = {"THE_TRAGEDY_OF_KING_LEAR_KENT": (4, 1), "THE_TEMPEST_ARIEL": (3, 1), "AS_YOU_LIKE_IT_ROSALIND": (5, 2),
         "THE_TEMPEST_CALIBAN": (2, 1), "THE_TRAGEDY_OF_KING_LEAR_EDGAR": (6, 2)}


def role_data(index: int, count: int, offset: int) -> dict:
    """``count`` 80-character strings of LEAF's letters and the character after each, distinct per role."""
    rng = np.random.default_rng(1000 + 100 * index + offset)
    text = "".join(LEAF_LETTERS[i] for i in rng.integers(0, len(LEAF_LETTERS), size=count + 80))
    return {"x": [text[j:j + 80] for j in range(count)], "y": [text[j + 80] for j in range(count)]}


def write_shakespeare(root: Path, roles: dict[str, tuple[int, int]] = ROLES) -> dict:
    """LEAF's files for ``roles`` (one file per split, with the "hierarchies" key LEAF writes for Shakespeare);
    their data by split."""
    written: dict[str, dict] = {}
    names = list(roles)
    for split, column in (("train", 0), ("test", 1)):
        folder = root / "shakespeare" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        data = {u: role_data(names.index(u), roles[u][column], column) for u in names}
        written[split] = data
        body = {"users": names, "hierarchies": [u.rsplit("_", 1)[0] for u in names],
                "num_samples": [roles[u][column] for u in names], "user_data": data}
        (folder / f"all_data_niid_0_keep_0_{split}_8.json").write_text(json.dumps(body))
    return written
