"""The llama.cpp runner: a GGUF scored by llama.cpp itself (llama-cpp-python's Llama with every
position's logits, `logits_all`), on the validation windows, as the torch runner scores a
checkpoint: the full next-token distribution at every position, so the KL divergence against the
reference's top-k is exact over those tokens (metrics.kl_topk), with nothing lumped by a top-k of
the candidate's.

llama-cpp-python 0.3.36 facts used (llama_cpp/llama.py): `Llama(model_path, n_ctx, n_batch, n_ubatch,
n_threads, logits_all, verbose)`; `eval(tokens)` decodes token ids in batches of n_batch and, with
logits_all, keeps the logits of every position in `scores` [n_ctx, n_vocab]; `reset()` empties the
context; `n_vocab()`."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

from trtbuild.validate.metrics import Comparison
from trtbuild.validate.torch_runner import compare_log_probs


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


def load(model: Path, seq_len: int):
    """The GGUF in llama.cpp, sized for one window and keeping every position's logits."""
    import os

    from llama_cpp import Llama

    return Llama(model_path=str(model), n_ctx=seq_len, n_batch=seq_len, n_ubatch=seq_len, logits_all=True,
                 n_threads=os.cpu_count() or 1, verbose=False)


def log_probs(llm, window: np.ndarray) -> np.ndarray:
    """log-softmax of llama.cpp's logits that predict tokens 1..L-1 of the window: [L-1, V] float32."""
    llm.reset()
    llm.eval([int(t) for t in window])
    return _log_softmax(np.asarray(llm.scores[:len(window) - 1], dtype=np.float32))


def compare(model: Path, windows: np.ndarray, ref: dict[str, np.ndarray],
            progress: Optional[Callable[[int, int], None]] = None) -> Comparison:
    llm = load(model, int(windows.shape[1]))
    try:
        return compare_log_probs(lambda window: log_probs(llm, window), windows, ref, progress)
    finally:
        llm.close()
