"""The demo's q8_0-gguf, pulled, served by its own packaged llama.cpp server command
(tests/llamacpp_server.py) as a real OpenAI-compatible endpoint on the CPU: it lists the model,
completes a prompt, and leaves no process behind, also when the block it serves is left by an error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llamacpp_server import LlamaCppServer, group_alive, request_json


@pytest.fixture(scope="module")
def served(demo_gguf, tmp_path_factory):
    """q8_0-gguf pulled into a folder of its own, from the build's store pushed to a folder store."""
    store, env, _ = demo_gguf
    root = tmp_path_factory.mktemp("llamacpp-serving")
    for args in (["push", "--store", root / "shared", "--target", "q8_0-gguf"],
                 ["pull", "--store", root / "shared", "--target", "q8_0-gguf", "--dest", root / "served"]):
        done = subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                              env={**env, "TRTBUILD_CACHE": str(store)}, timeout=600)
        assert done.returncode == 0, done.stderr
    return root / "served"


def test_the_packaged_server_answers_models_and_a_greedy_completion_then_is_gone(served):
    server = LlamaCppServer(served)
    with server as url:
        assert group_alive(server.pid)
        models = request_json(f"{url}/v1/models")
        assert [m["id"] for m in models["data"]] == ["model.gguf"]  # the packaged --model, as the server names it
        done = request_json(f"{url}/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
        choice = done["choices"][0]
        assert (done["object"], done["model"], done["usage"]["completion_tokens"], choice["finish_reason"]) == (
            "text_completion", "model.gguf", 8, "length")
        assert choice["text"].strip() != ""
        again = request_json(f"{url}/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
        assert again["choices"][0]["text"] == choice["text"]  # greedy: the same text
    assert (server.process.returncode is not None, group_alive(server.pid)) == (True, False)


def test_leaving_the_block_by_an_error_still_stops_the_whole_process_group(served):
    server = LlamaCppServer(served)
    with pytest.raises(RuntimeError, match="^the test failed here$"):
        with server:
            raise RuntimeError("the test failed here")
    assert (server.process.returncode is not None, group_alive(server.pid)) == (True, False)


def test_a_server_that_exits_before_answering_is_one_error_with_its_log_and_leaves_nothing(served, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "serving").mkdir()
    (broken / "serving" / "llamacpp_server.json").write_text((served / "serving" / "llamacpp_server.json").read_text())
    server = LlamaCppServer(broken)  # no model.gguf beside it: the server cannot start
    with pytest.raises(RuntimeError, match="^the llama.cpp server exited with 1 before answering:\n"):
        with server:
            pass
    assert (server.process.returncode, group_alive(server.pid)) == (1, False)
