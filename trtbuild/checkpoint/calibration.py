"""Calibration text and token windows for post-training quantization.

The calibration set is plain text (the built-in `pydoc_data.topics` prose, a text file, or a folder
of text files), tokenized once with the model's own tokenizer and cut into `samples` windows of
`seq_len` consecutive tokens. Window positions come from a counter-mode SHA-256 stream of the seed,
not from numpy's generators, so the same (text, tokenizer, samples, seq_len, seed) gives the same
windows on every numpy version and platform.

No numpy, torch or transformers at import time (they are imported inside the functions that use
them): planning a build reads the calibration text's digest through this module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Union

from trtbuild.errors import InvalidInput

BUILTIN = "builtin"
TEXT_SUFFIXES = (".txt", ".md", ".rst")
WINDOWS_NPY = "windows.npy"
WINDOWS_JSON = "windows.json"
_SEPARATOR = "\n\n"


def _builtin_text() -> str:
    from pydoc_data.topics import topics

    return _SEPARATOR.join(topics[key] for key in sorted(topics))


def _resolve(spec: str, base_dir: Union[Path, str]) -> Path:
    path = Path(os.path.expanduser(spec))
    if not path.is_absolute():
        path = Path(base_dir) / path
    return path


def _text_files(folder: Path) -> list[Path]:
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES]
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def _read_file(path: Path, spec: str, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{field}: {spec}: {path.name} is not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        raise InvalidInput(f"{field}: {spec}: cannot read {path}: {e.strerror or e}")


def read_text(spec: str, base_dir: Union[Path, str], field: str = "calibration.text", builtin=None) -> str:
    """The text named by `spec` (for `field`, which error messages name).

    `builtin`: the prose of Python's `pydoc_data.topics` (topics joined in sorted key order), or
    what the `builtin` callable returns. Otherwise a text file, or a folder whose `*.txt`, `*.md`,
    `*.rst` files (recursive, sorted by relative path) are joined with a blank line. A relative path
    is relative to `base_dir`.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInput(f"{field}: expected 'builtin' or a path to a text file or folder")
    if spec == BUILTIN:
        return (builtin or _builtin_text)()
    path = _resolve(spec, base_dir)
    if path.is_file():
        return _read_file(path, spec, field)
    if path.is_dir():
        files = _text_files(path)
        if not files:
            raise InvalidInput(f"{field}: {spec}: folder holds no text files "
                               f"({', '.join('*' + s for s in TEXT_SUFFIXES)})")
        return _SEPARATOR.join(_read_file(p, spec, field) for p in files)
    raise InvalidInput(f"{field}: {spec}: no such file or folder")


def text_digest(spec: str, base_dir: Union[Path, str]) -> str:
    """SHA-256 (hex) of the calibration text itself: file and folder names do not count."""
    return hashlib.sha256(read_text(spec, base_dir).encode("utf-8")).hexdigest()


def _stream(seed: int, label: str):
    """Deterministic 64-bit integers from (seed, label), independent of numpy's RNG versions."""
    counter = 0
    while True:
        digest = hashlib.sha256(f"trtbuild-calibration:{seed}:{label}:{counter}".encode()).digest()
        for i in range(0, 32, 8):
            yield int.from_bytes(digest[i:i + 8], "little")
        counter += 1


def choose_starts(n_tokens: int, samples: int, seq_len: int, seed: int) -> tuple[list[int], bool]:
    """`samples` window start positions in [0, n_tokens - seq_len], in text order.

    Non-overlapping when the text holds samples * seq_len tokens: draw `samples` offsets into the
    slack (n_tokens - samples * seq_len), sort them and add i * seq_len to the i-th, which gives
    windows that never overlap yet sit anywhere in the text. Otherwise overlapping random starts.
    """
    if n_tokens < seq_len:
        raise InvalidInput(f"calibration text has {n_tokens} tokens, fewer than seq_len {seq_len}")
    rnd = _stream(seed, "starts")
    if n_tokens >= samples * seq_len:
        slack = n_tokens - samples * seq_len
        offsets = sorted(next(rnd) % (slack + 1) for _ in range(samples))
        return [o + i * seq_len for i, o in enumerate(offsets)], False
    span = n_tokens - seq_len
    return sorted(next(rnd) % (span + 1) for _ in range(samples)), True


def tokenize(tokenizer_dir: Union[Path, str], text: str) -> np.ndarray:
    """The whole text as token ids (no special tokens), with the model's own tokenizer."""
    import numpy as np
    import transformers
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{tokenizer_dir}: cannot load the tokenizer: {e}")
    # The text is far longer than model_max_length on purpose: silence that one warning.
    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    finally:
        transformers.logging.set_verbosity(previous)
    return np.asarray(ids, dtype=np.int64)


def make_windows(tokenizer_dir: Union[Path, str], text: str, samples: int, seq_len: int,
                 seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """(ids int32 [samples, seq_len], metadata). Metadata: tokens (in the text), samples, seq_len,
    seed, overlapping (True when the text is too short for disjoint windows), starts."""
    import numpy as np

    for name, value in (("samples", samples), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInput(f"calibration.{name} must be a positive integer, got {value!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InvalidInput(f"calibration.seed must be an integer, got {seed!r}")
    tokens = tokenize(tokenizer_dir, text)
    n = int(tokens.shape[0])
    if n < seq_len:
        raise InvalidInput(f"calibration text has {n} tokens with this tokenizer, "
                           f"fewer than seq_len {seq_len}")
    if int(tokens.max(initial=0)) > np.iinfo(np.int32).max:
        raise InvalidInput("calibration: token ids do not fit in int32")
    starts, overlapping = choose_starts(n, samples, seq_len, seed)
    ids = np.stack([tokens[s:s + seq_len] for s in starts]).astype(np.int32)
    meta = {"tokens": n, "samples": samples, "seq_len": seq_len, "seed": seed,
            "overlapping": overlapping, "starts": starts}
    return ids, meta


def save_windows(folder: Union[Path, str], ids: np.ndarray, meta: dict[str, Any]) -> None:
    """`windows.npy` (int32 [samples, seq_len]) and `windows.json` (the metadata, shape, dtype)."""
    import numpy as np

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    if ids.ndim != 2:
        raise ValueError(f"windows must be 2-D [samples, seq_len], got shape {ids.shape}")
    np.save(folder / WINDOWS_NPY, ids, allow_pickle=False)
    doc = dict(meta)
    doc.update({"shape": list(ids.shape), "dtype": "int32",
                "sha256": hashlib.sha256(ids.tobytes()).hexdigest()})
    (folder / WINDOWS_JSON).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def load_windows(folder: Union[Path, str]) -> np.ndarray:
    """The windows saved by `save_windows`, checked against their metadata."""
    import numpy as np

    folder = Path(folder)
    try:
        meta = json.loads((folder / WINDOWS_JSON).read_text())
        ids = np.load(folder / WINDOWS_NPY, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{folder}: no readable calibration windows: {e}")
    if ids.dtype != np.int32 or list(ids.shape) != list(meta.get("shape", [])):
        raise InvalidInput(f"{folder}: windows.npy ({ids.dtype}, {list(ids.shape)}) does not match "
                           f"windows.json ({meta.get('dtype')}, {meta.get('shape')})")
    if "sha256" in meta and hashlib.sha256(np.ascontiguousarray(ids).tobytes()).hexdigest() != meta["sha256"]:
        raise InvalidInput(f"{folder}: windows.npy does not match the sha256 in windows.json")
    return ids
