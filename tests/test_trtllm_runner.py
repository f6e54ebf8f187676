"""The TensorRT-LLM validation runner without TensorRT-LLM: availability, the requests it would send,
and the parsers, fed objects shaped exactly like TensorRT-LLM's own outputs (RequestOutput,
CompletionOutput, prompt_logprobs as a list of {token_id: Logprob(logprob, rank)} per prompt token)
and built the way TensorRT-LLM builds them (result.compute_logprobs: log_softmax in float32, top-k,
one dict per context-logits row, ranks from 1)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch

from conftest import needs_no_trtllm
from trtbuild.errors import TrtbuildError
from trtbuild.validate import trtllm_runner as runner
from trtbuild.validate.trtllm_runner import (LogprobRequest, available, build_requests, parse_context_logits,
                                             parse_prompt_logprobs)

# --------------------------------------------------------------------------------------------
# Stand-ins with the fields of tensorrt_llm/executor/result.py@a678b91a and llmapi/llm.py@4c05a748
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: Optional[int] = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: Optional[list] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list] = field(default_factory=list)
    prompt_logprobs: Optional[list] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Any = None
    generation_logits: Optional[torch.Tensor] = None


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list
    outputs: list
    context_logits: Optional[torch.Tensor] = None
    finished: bool = True
    prompt: Optional[str] = None


def topk_logprobs(logits: torch.Tensor, top_k: int, tokens: Optional[list] = None) -> list:
    """TensorRT-LLM's compute_logprobs._topk_logprobs, on the CPU."""
    if logits.dim() == 3:
        logits = logits.squeeze(0)
    logprobs = torch.log_softmax(logits.to(dtype=torch.float32), dim=-1)
    vals, idx = torch.topk(logprobs, k=top_k, dim=-1)
    results = []
    for t in range(logprobs.size(0)):
        d = {i.item(): Logprob(logprob=v.item(), rank=r + 1) for r, (v, i) in enumerate(zip(vals[t], idx[t]))}
        if tokens is not None and tokens[t] not in d:
            lp = logprobs[t, tokens[t]].item()
            d[tokens[t]] = Logprob(logprob=lp, rank=int((logprobs[t] > lp).sum().item()) + 1)
        results.append(d)
    return results


S, L, V, K = 3, 9, 50, 5


@pytest.fixture
def case():
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, V, (S, L), generator=g).numpy().astype(np.int32)
    logits = [torch.randn(L, V, generator=g) * 3 for _ in range(S)]  # [L, V] per request, as returned
    for w, lg in zip(windows, logits):
        for t in range(0, L - 1, 2):  # row t predicts token t+1: make it likely at even t
            lg[t, int(w[t + 1])] += 12.0
    return windows, logits


def request_outputs(windows, logits, *, k=K, with_tokens=False, context=False):
    outs = []
    for i, (w, lg) in enumerate(zip(windows, logits)):
        generated = int(lg[-1].argmax())
        # Later TensorRT-LLM passes prompt_token_ids[1:] + [first generated token] so each dict also
        # holds the actual next token; 1.2.0rc2 passes None (top-k only).
        tokens = [int(x) for x in w[1:]] + [generated] if with_tokens else None
        completion = CompletionOutput(0, token_ids=[generated],
                                      prompt_logprobs=[] if context else topk_logprobs(lg, k, tokens))
        outs.append(RequestOutput(i, [int(x) for x in w], [completion], context_logits=lg if context else None))
    return outs


def expected(windows, logits, k=K):
    """What the torch runner computes: log_softmax rows 0..L-2, top-k by value, target t+1."""
    ids, logps, targets = [], [], []
    for w, lg in zip(windows, logits):
        logp = torch.log_softmax(lg[:-1].double(), dim=-1)
        v, i = torch.topk(logp, k, dim=-1)
        ids.append(i.numpy())
        logps.append(v.numpy())
        targets.append(logp[torch.arange(L - 1), torch.from_numpy(w[1:]).long()].numpy())
    return np.stack(ids).astype(np.int32), np.stack(logps).astype(np.float32), np.stack(targets).astype(np.float32)


# --------------------------------------------------------------------------------------------
# available()
# --------------------------------------------------------------------------------------------

@needs_no_trtllm
def test_available_reports_the_reason_here():
    assert importlib.util.find_spec("tensorrt_llm") is None  # this machine
    reason = available()
    assert reason is not None
    assert reason.startswith("needs tensorrt_llm 1.2.x and an NVIDIA GPU (this machine: no tensorrt_llm")
    assert available("hf").startswith("needs tensorrt_llm (PyTorch backend, 1.3 or later) and an NVIDIA GPU "
                                      "(this machine: no tensorrt_llm")


def test_available_checks_version_and_gpu(monkeypatch):
    monkeypatch.setattr(runner, "_trtllm_version", lambda: "1.1.0")
    monkeypatch.setattr(runner, "_gpu_visible", lambda: True)
    assert available() == "needs tensorrt_llm 1.2.x and an NVIDIA GPU (this machine: tensorrt_llm 1.1.0)"
    monkeypatch.setattr(runner, "_trtllm_version", lambda: "1.2.0rc2")
    monkeypatch.setattr(runner, "_gpu_visible", lambda: False)
    assert available() == "needs tensorrt_llm 1.2.x and an NVIDIA GPU (this machine: no NVIDIA GPU visible)"
    for version in ("1.2.0rc2", "1.2.1"):
        monkeypatch.setattr(runner, "_trtllm_version", lambda v=version: v)
        monkeypatch.setattr(runner, "_gpu_visible", lambda: True)
        assert available() is None
    monkeypatch.setattr(runner, "_trtllm_version", lambda: "1.20.0")
    assert "tensorrt_llm 1.20.0" in available()
    assert available("hf") is None  # hf-checkpoints run on the PyTorch backend from 1.3 on
    # engines need the recipe's pinned line (toolchain.tensorrt_llm), which names itself in the reason
    assert available("engine", "1.20") is None
    assert available("engine", "1.3") == ("needs tensorrt_llm 1.3.x and an NVIDIA GPU "
                                          "(this machine: tensorrt_llm 1.20.0)")
    monkeypatch.setattr(runner, "_trtllm_version", lambda: "0.21.0")
    assert "tensorrt_llm 0.21.0" in available("hf")
    # issue #23: "1.0 or later" where the runtime table (and README) serve hf-checkpoints from 1.3
    for version in ("1.0.0", "1.2.1"):
        monkeypatch.setattr(runner, "_trtllm_version", lambda v=version: v)
        assert available("hf") == ("needs tensorrt_llm (PyTorch backend, 1.3 or later) and an NVIDIA GPU "
                                   f"(this machine: tensorrt_llm {version})")
    for version in ("1.3.0rc2", "1.3.1", "2.0.0"):
        monkeypatch.setattr(runner, "_trtllm_version", lambda v=version: v)
        assert available("hf") is None


def test_the_pytorch_backends_first_version_is_the_runtime_tables():
    """One fact in one place: the version validate-trtllm asks for, the one `pull` asks for, and
    the runtime table's trtllm row (its label `trtllm>=1.3`)."""
    import json

    from trtbuild.deploy import select as pullselect

    from trtbuild.facts import serving

    import trtbuild

    table = json.loads((Path(trtbuild.__file__).parent / "data" / "runtime-support.json").read_text())
    assert (table["runtimes"]["trtllm"]["versions"], table["runtimes"]["trtllm"]["label"]) == (["1.3"], "trtllm>=1.3")
    assert serving.oldest_version("trtllm") == "1.3"
    # pull counts a tensorrt_llm for hf-checkpoints from that version on
    assert pullselect._runtime_problem("trtllm", "1.2.1") == ("1.2.1 is installed; its PyTorch backend serves "
                                                              "hf-checkpoints from 1.3 on")
    assert pullselect._runtime_problem("trtllm", "1.3.0rc2") is None
    assert "(PyTorch backend, 1.3 or later)" in runner.NEEDS["hf"]


@needs_no_trtllm
def test_llm_api_and_run_refuse_here():
    with pytest.raises(TrtbuildError, match="no tensorrt_llm"):
        runner.to_llm_api(build_requests(np.zeros((1, 4), np.int32), 2))
    with pytest.raises(TrtbuildError, match="no tensorrt_llm"):
        runner.run("engine_dir", np.zeros((1, 4), np.int32), np.zeros((1, 3, 2), np.int32), "engine")


# --------------------------------------------------------------------------------------------
# build_requests
# --------------------------------------------------------------------------------------------

def test_build_requests_prompt_logprobs():
    windows = np.array([[5, 6, 7, 8], [1, 2, 3, 4]], dtype=np.int32)
    requests = build_requests(windows, 64)
    assert requests == [
        LogprobRequest([5, 6, 7, 8], {"max_tokens": 1, "prompt_logprobs": 64, "end_id": -1, "pad_id": -1,
                                      "detokenize": False}),
        LogprobRequest([1, 2, 3, 4], {"max_tokens": 1, "prompt_logprobs": 64, "end_id": -1, "pad_id": -1,
                                      "detokenize": False}),
    ]
    assert all(type(x) is int for r in requests for x in r.prompt_token_ids)  # not numpy scalars


def test_build_requests_context_logits_and_tokenizer_end_id():
    windows = np.array([[5, 6, 7]], dtype=np.int32)
    assert build_requests(windows, 64, path="context_logits", end_id=None) == [
        LogprobRequest([5, 6, 7], {"max_tokens": 1, "return_context_logits": True, "detokenize": False})]


@pytest.mark.parametrize("windows,k,message", [
    (np.zeros((4,), np.int32), 5, "expected token ids"),
    (np.zeros((2, 1), np.int32), 5, "length >= 2"),
    (np.zeros((2, 3), np.float32), 5, "integer token ids"),
    (np.zeros((2, 3), np.int32), 0, "positive integer"),
])
def test_build_requests_rejects(windows, k, message):
    with pytest.raises(TrtbuildError, match=message):
        build_requests(windows, k)


# --------------------------------------------------------------------------------------------
# parse_prompt_logprobs
# --------------------------------------------------------------------------------------------

def test_prompt_logprobs_alignment_top_k_only(case):
    """1.2.0rc2: entry t (from the logits row at token t) predicts token t+1; the last entry
    predicts the generated token and is dropped; targets outside the top k are unknown."""
    windows, logits = case
    got = parse_prompt_logprobs(request_outputs(windows, logits), windows, K)
    ids, logps, targets = expected(windows, logits)
    assert got["topk_ids"].dtype == np.int32 and got["topk_ids"].shape == (S, L - 1, K)
    assert got["topk_logp"].dtype == np.float32 and got["topk_logp"].shape == (S, L - 1, K)
    assert got["target_logp"].dtype == np.float32 and got["target_logp"].shape == (S, L - 1)
    np.testing.assert_array_equal(got["topk_ids"], ids)
    np.testing.assert_allclose(got["topk_logp"], logps, atol=1e-5)
    in_topk = (ids == windows[:, 1:, None]).any(axis=-1)
    assert in_topk[:, ::2].all() and not in_topk.all()  # the rows made to predict token t+1, and others
    np.testing.assert_array_equal(got["target_found"], in_topk)
    np.testing.assert_allclose(got["target_logp"][in_topk], targets[in_topk], atol=1e-5)
    assert np.isnan(got["target_logp"][~in_topk]).all()


def test_prompt_logprobs_with_actual_tokens_added(case):
    """Later versions add the actual next token to each dict (rank may exceed k): exact targets,
    and the extra token stays out of the top k."""
    windows, logits = case
    got = parse_prompt_logprobs(request_outputs(windows, logits, with_tokens=True), windows, K)
    ids, logps, targets = expected(windows, logits)
    np.testing.assert_array_equal(got["topk_ids"], ids)
    np.testing.assert_allclose(got["topk_logp"], logps, atol=1e-5)
    assert got["target_found"].all()
    np.testing.assert_allclose(got["target_logp"], targets, atol=1e-5)


def test_prompt_logprobs_fewer_than_requested(case):
    windows, logits = case
    got = parse_prompt_logprobs(request_outputs(windows, logits, k=3), windows, K)
    ids, logps, _ = expected(windows, logits)
    np.testing.assert_array_equal(got["topk_ids"][..., :3], ids[..., :3])
    np.testing.assert_allclose(got["topk_logp"][..., :3], logps[..., :3], atol=1e-5)
    assert (got["topk_ids"][..., 3:] == -1).all()
    assert np.isneginf(got["topk_logp"][..., 3:]).all()


def test_prompt_logprobs_more_than_requested_keeps_k(case):
    windows, logits = case
    got = parse_prompt_logprobs(request_outputs(windows, logits, k=8), windows, K)
    ids, _, targets = expected(windows, logits)
    np.testing.assert_array_equal(got["topk_ids"], ids)
    # A target ranked 6..8 is still a known log-prob.
    ids8, _, _ = expected(windows, logits, k=8)
    np.testing.assert_array_equal(got["target_found"], (ids8 == windows[:, 1:, None]).any(axis=-1))


def test_prompt_logprobs_length_mismatch(case):
    windows, logits = case
    outs = request_outputs(windows, logits)
    outs[1].outputs[0].prompt_logprobs = outs[1].outputs[0].prompt_logprobs[:-1]
    with pytest.raises(TrtbuildError, match=r"output 1 has 8 positions for a window of 9 tokens"):
        parse_prompt_logprobs(outs, windows, K)


def test_prompt_logprobs_vllm_convention_rejected(case):
    windows, logits = case
    outs = request_outputs(windows, logits)
    outs[0].outputs[0].prompt_logprobs = [None] + outs[0].outputs[0].prompt_logprobs[1:]
    with pytest.raises(TrtbuildError, match="starts with None"):
        parse_prompt_logprobs(outs, windows, K)


def test_prompt_logprobs_missing(case):
    windows, logits = case
    outs = request_outputs(windows, logits)
    outs[2].outputs[0].prompt_logprobs = []
    with pytest.raises(TrtbuildError, match="output 2 has none .*gather_context_logits"):
        parse_prompt_logprobs(outs, windows, K)


def test_outputs_count_and_order_checked(case):
    windows, logits = case
    outs = request_outputs(windows, logits)
    with pytest.raises(TrtbuildError, match="2 request outputs for 3 windows"):
        parse_prompt_logprobs(outs[:2], windows, K)
    with pytest.raises(TrtbuildError, match="output 0 is for a prompt .* not window 0"):
        parse_prompt_logprobs(outs[::-1], windows, K)


# --------------------------------------------------------------------------------------------
# parse_context_logits
# --------------------------------------------------------------------------------------------

def test_context_logits(case):
    windows, logits = case
    got = parse_context_logits(request_outputs(windows, logits, context=True), windows, K)
    ids, logps, targets = expected(windows, logits)
    assert got["topk_ids"].dtype == np.int32 and got["topk_logp"].dtype == np.float32
    assert got["target_logp"].dtype == np.float32
    np.testing.assert_array_equal(got["topk_ids"], ids)
    np.testing.assert_allclose(got["topk_logp"], logps, atol=1e-5)
    np.testing.assert_allclose(got["target_logp"], targets, atol=1e-5)
    assert got["target_found"].all()
    # The two paths agree where both know the answer.
    via_prompt = parse_prompt_logprobs(request_outputs(windows, logits), windows, K)
    np.testing.assert_array_equal(via_prompt["topk_ids"], got["topk_ids"])
    found = via_prompt["target_found"]
    np.testing.assert_allclose(via_prompt["target_logp"][found], got["target_logp"][found], atol=1e-5)


def test_context_logits_vocab_padding_batch_dim_and_half(case):
    windows, logits = case
    # An engine at tp 4 pads the vocab (50 -> 52) with zero rows of lm_head: logit 0 columns.
    padded = [torch.cat([lg, torch.zeros(L, 2)], dim=1)[None].half() for lg in logits]  # [1, L, V+2], fp16
    got = parse_context_logits(request_outputs(windows, padded, context=True), windows, K, vocab_size=V)
    ids, logps, targets = expected(windows, [lg.half().float() for lg in logits])
    np.testing.assert_array_equal(got["topk_ids"], ids)
    np.testing.assert_allclose(got["target_logp"], targets, atol=1e-5)
    unpadded = parse_context_logits(request_outputs(windows, padded, context=True), windows, K)
    assert not np.allclose(unpadded["target_logp"], targets, atol=1e-3)  # padding columns would take mass


def test_context_logits_k_above_vocab(case):
    windows, logits = case
    small = [lg[:, :4] for lg in logits]
    w = windows % 4
    got = parse_context_logits(request_outputs(w, small, context=True), w, K)
    assert (got["topk_ids"][..., 4:] == -1).all() and np.isneginf(got["topk_logp"][..., 4:]).all()
    np.testing.assert_allclose(np.exp(got["topk_logp"][..., :4].astype(np.float64)).sum(-1), 1.0, atol=1e-5)


def test_context_logits_shape_mismatch(case):
    windows, logits = case
    outs = request_outputs(windows, logits, context=True)
    outs[1].context_logits = outs[1].context_logits[:-1]
    with pytest.raises(TrtbuildError, match=r"output 1 has shape \[8, 50\], expected \[9, vocab\]"):
        parse_context_logits(outs, windows, K)
    outs[1].context_logits = None
    with pytest.raises(TrtbuildError, match="output 1 has none"):
        parse_context_logits(outs, windows, K)
    with pytest.raises(TrtbuildError, match="fewer than the vocabulary"):
        parse_context_logits(request_outputs(windows, logits, context=True), windows, K, vocab_size=V + 1)
