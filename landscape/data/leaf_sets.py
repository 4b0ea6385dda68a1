"""The data sets of the LEAF benchmark read from the JSON files its preprocessing writes, with their natural
clients: `femnist` (Federated EMNIST, one client per writer) and `shakespeare` (next character, one client per
speaking role), registered in ``datasets.DATASETS``. LEAF: Caldas et al. 2018, "LEAF: A Benchmark for Federated
Settings" (github.com/TalwalkarLab/leaf).

On disk, LEAF's layout after ``data/<name>/preprocess.sh -t sample`` (each user's samples split into train and
test): ``<root>/<name>/data/train/*.json`` and ``<root>/<name>/data/test/*.json``, so ``--data-root`` is LEAF's
``data`` folder. Each file is ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
"y": [...]}}}`` (other keys, such as Shakespeare's "hierarchies", are not read). A FEMNIST image is 784 floats
in [0, 1] (the 28x28 grey image row by row divided by 255: 1 is the white background), its label 0..61 (digits
0-9, upper-case letters 10-35, lower-case 36-61). A Shakespeare sample is an 80-character string and the
character after it, both read as indices into LEAF's 80-character vocabulary (inputs [80] of indices, 80
classes).

``partition.clients`` users, drawn with the recipe's seed among the users with training samples (all of them
when it equals their number), make the training set, each user's samples one client of the ``natural``
partition; the test set is the same users' test samples (LEAF's per-user held-out share).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from landscape.core.errors import LandscapeError, shown
from landscape.data.datasets import DATASETS, DatasetBundle, make_bundle

FEMNIST_SIDE = 28
FEMNIST_CLASSES = 62


@dataclass(frozen=True)
class _Writer:
    x: np.ndarray  # float32 [n, C, H, W] (or the data set's own input shape)
    y: np.ndarray  # int64 [n]


def _malformed(path: Path, what: str) -> LandscapeError:
    return LandscapeError(f"malformed LEAF file {path}: {what}")


def _split_files(name: str, root: Path, split: str) -> list[Path]:
    """The split's JSON files, sorted by name; a one-line error naming the folder when it has none."""
    folder = root / name / "data" / split
    expected = (f"LEAF's preprocessed {name} JSON files, {name}/data/train/*.json and {name}/data/test/*.json "
                f"under --data-root (run LEAF's data/{name}/preprocess.sh -t sample and pass its data folder)")
    if not folder.is_dir():
        raise LandscapeError(f"{name}: missing folder {folder} ({expected})")
    files = sorted(p for p in folder.glob("*.json") if p.is_file())
    if not files:
        raise LandscapeError(f"{name}: no *.json files in {folder} ({expected})")
    return files


class _Floats(dict):
    """float(text) by the number's text, each text converted once: LEAF's pixels are few distinct numbers (the
    256 grey levels k / 255), and looking a number's text up is faster than converting it again. The values are
    those of ``float(text)``, as ``json.loads`` makes them; at most ``_FLOAT_TEXTS`` texts are kept."""

    def __missing__(self, text: str) -> float:
        value = float(text)
        if len(self) < _FLOAT_TEXTS:
            self[text] = value
        return value


_FLOAT_TEXTS = 1 << 16


def _read_json(path: Path) -> dict[str, Any]:
    """A LEAF file's object, its lists checked. Its numbers are those ``json.loads`` makes; a float's text is
    converted once per file (``_Floats``): the parse of the pixels is most of the time a FEMNIST folder takes to
    load, and converting each of its few distinct texts again was most of the parse."""
    try:
        data = json.loads(path.read_bytes(), parse_float=_Floats().__getitem__)
    except (OSError, ValueError) as error:  # unreadable, not UTF-8 or not JSON (JSONDecodeError is a ValueError)
        first = (str(error).strip().splitlines() or [""])[0]
        raise _malformed(path, f"{type(error).__name__}: {first}") from None
    if not isinstance(data, dict):
        raise _malformed(path, f"expected a JSON object with users, num_samples and user_data, got "
                               f"{type(data).__name__}")
    users, counts, user_data = data.get("users"), data.get("num_samples"), data.get("user_data")
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        raise _malformed(path, "'users' must be a list of names")
    if not isinstance(counts, list) or len(counts) != len(users):
        raise _malformed(path, "'num_samples' must be a list with one count per user")
    if not isinstance(user_data, dict):
        raise _malformed(path, "'user_data' must be an object with an entry per user")
    return data


def _femnist_samples(path: Path, user: str, x: Any, y: Any) -> _Writer:
    """One writer's images [n, 1, 28, 28] and labels, checked."""
    try:
        images = np.asarray(x, dtype=np.float32) if x else np.zeros((0, FEMNIST_SIDE ** 2), dtype=np.float32)
    except (ValueError, TypeError):
        raise _malformed(path, f"user {shown(user)}: 'x' must be a list of images of {FEMNIST_SIDE ** 2} "
                               "numbers each") from None
    if images.ndim != 2 or images.shape[1] != FEMNIST_SIDE ** 2:
        raise _malformed(path, f"user {shown(user)}: 'x' must be a list of images of {FEMNIST_SIDE ** 2} "
                               f"numbers each (got shape {list(images.shape)})")
    if not (np.isfinite(images).all() and images.min(initial=0.0) >= 0.0 and images.max(initial=0.0) <= 1.0):
        raise _malformed(path, f"user {shown(user)}: pixel values must lie in [0, 1] (LEAF's grey level / 255)")
    labels = np.asarray(y)
    if labels.ndim != 1 or (len(labels) and labels.dtype.kind not in "iu"):
        raise _malformed(path, f"user {shown(user)}: 'y' must be a list of integer labels")
    labels = labels.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= FEMNIST_CLASSES):
        raise _malformed(path, f"user {shown(user)}: labels must lie in 0..{FEMNIST_CLASSES - 1}")
    return _Writer(images.reshape(-1, 1, FEMNIST_SIDE, FEMNIST_SIDE), labels)


def read_leaf_split(name: str, root: Path, split: str, samples: Callable[[Path, str, Any, Any], _Writer],
                    wanted: set[str] | None = None) -> dict[str, _Writer]:
    """Every writer of a split (or only those in ``wanted``) by name, in file order, each checked: its entry in
    user_data, x and y of one length, that length its num_samples; then ``samples`` makes (and checks) its
    arrays from x and y. A writer in two files is an error."""
    writers: dict[str, _Writer] = {}
    seen: dict[str, Path] = {}
    for path in _split_files(name, root, split):
        data = _read_json(path)
        for user, count in zip(data["users"], data["num_samples"]):
            if user in seen:
                raise LandscapeError(f"{name}: user {shown(user)} appears in both {seen[user]} and {path}")
            seen[user] = path
            if wanted is not None and user not in wanted:
                continue
            entry = data["user_data"].get(user)
            if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) \
                    or not isinstance(entry.get("y"), list):
                raise _malformed(path, f"user {shown(user)} needs user_data entry {{\"x\": [...], \"y\": [...]}}")
            if len(entry["x"]) != len(entry["y"]) or len(entry["y"]) != count:
                raise _malformed(path, f"user {shown(user)}: num_samples {count!r}, {len(entry['x'])} x and "
                                       f"{len(entry['y'])} y")
            writers[user] = samples(path, user, entry["x"], entry["y"])
    return writers


def _concatenate(writers: list[_Writer]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([w.x for w in writers]), np.concatenate([w.y for w in writers])


def _load_writers(name: str, root: Path, download: bool, num_clients: int, seed: int,
                  samples: Callable[[Path, str, Any, Any], _Writer], num_classes: int, who: str) -> DatasetBundle:
    """``num_clients`` of the data set's users (``who``: writers, roles) drawn by ``seed`` among those with
    training samples, their training samples one client each (the natural partition) and their test samples the
    test set."""
    if download:
        raise LandscapeError(f"{name} cannot be downloaded here: LEAF's data/{name}/preprocess.sh downloads "
                             "and writes it; pass --data-root to LEAF's data folder")
    train = {user: w for user, w in read_leaf_split(name, root, "train", samples).items() if len(w.y)}
    folder = root / name / "data" / "train"
    if num_clients > len(train):
        raise LandscapeError(f"{name}: {num_clients} clients asked for (partition.clients), but {folder} holds "
                             f"{len(train)} {who} with training samples; at most {len(train)}")
    names = list(train)
    chosen = [names[i] for i in sorted(np.random.default_rng(seed).choice(len(names), num_clients,
                                                                           replace=False))]
    test = read_leaf_split(name, root, "test", samples, wanted=set(chosen))
    if not test:
        raise LandscapeError(f"{name}: none of the {num_clients} chosen {who} has samples in "
                             f"{root / name / 'data' / 'test'}; LEAF's split must be each user's samples "
                             "(preprocess.sh -t sample), not whole users (-t user)")
    x_train, y_train = _concatenate([train[user] for user in chosen])
    x_test, y_test = _concatenate([test[user] for user in chosen if user in test])
    sizes = np.cumsum([0] + [len(train[user].y) for user in chosen])
    natural = [np.arange(start, stop, dtype=np.int64) for start, stop in zip(sizes[:-1], sizes[1:])]
    return make_bundle(name, x_train, y_train, x_test, y_test, num_classes=num_classes, natural_partition=natural)


@DATASETS.register("femnist", summary="LEAF FEMNIST from <root>/femnist/data/{train,test}/*.json; "
                                      "partition.clients writers, own clients (natural)")
def load_femnist(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                 opts: None) -> DatasetBundle:
    return _load_writers("femnist", root, download, num_clients, seed, _femnist_samples, FEMNIST_CLASSES,
                         "writers")


# ---------------------------------------------------------------------------------------------------------
# shakespeare: LEAF's next-character task. Each client is one speaking role of one play; a sample is an
# 80-character string of the role's lines and the character that follows it. LEAF's models read both as indices
# into its 80-character vocabulary (models/utils/language_utils.py, ALL_LETTERS; word_to_indices).

SHAKESPEARE_VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SHAKESPEARE_LENGTH = 80  # LEAF's SEQ_LENGTH
_CHARACTER_INDEX = {c: i for i, c in enumerate(SHAKESPEARE_VOCABULARY)}


def _indices(path: Path, user: str, text: str) -> list[int]:
    try:
        return [_CHARACTER_INDEX[c] for c in text]
    except KeyError as error:
        raise _malformed(path, f"user {shown(user)}: character {error.args[0]!r} is not in LEAF's "
                               f"{len(SHAKESPEARE_VOCABULARY)}-character vocabulary") from None


def _shakespeare_samples(path: Path, user: str, x: Any, y: Any) -> _Writer:
    """One role's strings as character indices [n, 80] (float32, the inputs' dtype; exact) and next characters."""
    if not all(isinstance(s, str) and len(s) == SHAKESPEARE_LENGTH for s in x):
        raise _malformed(path, f"user {shown(user)}: 'x' must be a list of {SHAKESPEARE_LENGTH}-character strings")
    if not all(isinstance(c, str) and len(c) == 1 for c in y):
        raise _malformed(path, f"user {shown(user)}: 'y' must be a list of single characters")
    rows = [_indices(path, user, s) for s in x]
    inputs = np.asarray(rows, dtype=np.float32).reshape(len(rows), SHAKESPEARE_LENGTH)
    return _Writer(inputs, np.asarray(_indices(path, user, "".join(y)), dtype=np.int64))


@DATASETS.register("shakespeare", summary="LEAF Shakespeare (next character) from <root>/shakespeare/data/"
                                          "{train,test}/*.json; partition.clients roles, own clients (natural)")
def load_shakespeare(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                     opts: None) -> DatasetBundle:
    return _load_writers("shakespeare", root, download, num_clients, seed, _shakespeare_samples,
                         len(SHAKESPEARE_VOCABULARY), "roles")
