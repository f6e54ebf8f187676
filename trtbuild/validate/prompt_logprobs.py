"""Per-position top-k log-probability dicts, as the runtimes' LLM APIs return them for a prompt
(`{token_id: Logprob(logprob, rank)}`), turned into the arrays the gates compare with the reference:
`topk_ids` int32 [S, L-1, k], `topk_logp` float32 [S, L-1, k], `target_logp` float32 [S, L-1]
(NaN where the actual next token was not returned; `target_found` says where it was) and, given the
reference's top-k ids, `logp_at_reference` [S, L-1, k'] (NaN for the reference's tokens the candidate
did not return: metrics.kl_lumped lumps them into the tail).

Shared by the TensorRT-LLM runner and the vLLM runner: the two differ only in how a window's dicts
line up with its tokens, which each runner settles before calling `fill_window`."""

from __future__ import annotations

import math
from typing import Any, Iterator, Optional, Sequence

from trtbuild.errors import TrtbuildError


def check_outputs(outputs, windows: np.ndarray, what: str) -> list:
    """The outputs as a list, one per window and in the windows' order (by their prompt token ids)."""
    outputs = list(outputs)
    if len(outputs) != len(windows):
        raise TrtbuildError(f"{what}: {len(outputs)} request outputs for {len(windows)} windows")
    for i, (out, window) in enumerate(zip(outputs, windows)):
        prompt = getattr(out, "prompt_token_ids", None)
        if prompt is not None and [int(x) for x in prompt] != [int(x) for x in window]:
            raise TrtbuildError(f"{what}: output {i} is for a prompt of {len(prompt)} tokens that is not window {i} "
                                f"({len(window)} tokens): outputs must come in the order of the windows")
    return outputs


def scored_outputs(outputs, windows, k: int, ref_ids: Optional[np.ndarray], attribute: str, what: str,
                   unset: str) -> tuple[np.ndarray, dict[str, np.ndarray], Iterator[tuple[int, Any]]]:
    """What both runners start from: the windows as an array, the arrays to fill (`empty`) and,
    window by window in their order, (i, its output's `attribute`). The outputs are checked first
    (check_outputs); an output whose `attribute` is None is refused, naming `unset` (the setting
    that makes the runtime return it)."""
    import numpy as np

    windows = np.asarray(windows)
    S, L = windows.shape
    outputs = check_outputs(outputs, windows, what)
    result = empty(S, L - 1, k, ref_ids)

    def each() -> Iterator[tuple[int, Any]]:
        for i, out in enumerate(outputs):
            value = getattr(out, attribute, None)
            if value is None:
                raise TrtbuildError(f"{what}: output {i} has none ({unset})")
            yield i, value

    return windows, result, each()


def empty(S: int, n: int, k: int, ref_ids: Optional[np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays for S windows of n scored positions, nothing known yet."""
    import numpy as np

    result = {"topk_ids": np.full((S, n, k), -1, dtype=np.int32),
              "topk_logp": np.full((S, n, k), -np.inf, dtype=np.float32),
              "target_logp": np.full((S, n), np.nan, dtype=np.float32),
              "target_found": np.zeros((S, n), dtype=bool)}
    if ref_ids is not None:
        if ref_ids.shape[:2] != (S, n):
            raise TrtbuildError(f"reference top-k ids of shape {list(ref_ids.shape)} do not fit {S} windows of {n + 1} tokens")
        result["logp_at_reference"] = np.full(ref_ids.shape, np.nan, dtype=np.float32)
    return result


def fill_window(result: dict, i: int, entries: Sequence, window: np.ndarray, k: int,
                ref_ids: Optional[np.ndarray], what: str) -> None:
    """Window i's row of `result` from its L-1 dicts, entry t being the distribution after tokens
    0..t (the one that predicts token t+1). Fewer than k entries leave id -1 and log-prob -inf."""
    for t, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TrtbuildError(f"{what}: output {i} position {t}: expected a dict {{token_id: Logprob}}, "
                                f"got {type(entry).__name__}")
        # By rank (1..k); the actual token added beyond the top k has a larger rank and is left out
        # of the top k; entries without a rank come last, by log-prob.
        ranked = sorted((_rank(lp), -_logprob(lp), int(tok)) for tok, lp in entry.items())
        top = [(tok, -neg) for rank, neg, tok in ranked if rank == math.inf or rank <= k][:k]
        for j, (tok, logp) in enumerate(top):
            result["topk_ids"][i, t, j] = tok
            result["topk_logp"][i, t, j] = logp
        target = int(window[t + 1])
        if target in entry:
            result["target_logp"][i, t] = _logprob(entry[target])
            result["target_found"][i, t] = True
        if ref_ids is not None:
            for j, tok in enumerate(ref_ids[i, t]):
                if int(tok) in entry:
                    result["logp_at_reference"][i, t, j] = _logprob(entry[int(tok)])


def _logprob(value) -> float:
    return float(value.logprob if hasattr(value, "logprob") else value)


def _rank(value) -> float:
    rank = getattr(value, "rank", None)
    return math.inf if rank is None else int(rank)


def compare(candidate: dict, ref: dict, runner: str):
    """metrics.Comparison of a runner's arrays against the reference artifact's: KL over the
    reference's top-k (lumped where the candidate's log-prob is unknown), top-1, both NLLs."""
    import numpy as np

    from trtbuild.validate.metrics import Comparison, kl_lumped

    if not candidate["target_found"].all():
        raise TrtbuildError(f"{runner} validation runner: the actual next token's log-prob is missing at "
                            f"{int((~candidate['target_found']).sum())} positions")
    return Comparison(kl=kl_lumped(ref["topk_logp"], candidate["logp_at_reference"]),
                      top1=(candidate["topk_ids"][..., 0] == ref["topk_ids"][..., 0]).astype(np.float64),
                      ref_nll=-ref["target_logp"].astype(np.float64),
                      cand_nll=-candidate["target_logp"].astype(np.float64))
