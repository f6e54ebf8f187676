"""A real OpenAI-compatible endpoint for the tests: a gguf artifact's own packaged server command
(serving/llamacpp_server.json: llama-cpp-python's server, llama.cpp on the CPU), run from the
artifact's folder on a free loopback port.

    server = LlamaCppServer(folder)
    with server as url:          # http://127.0.0.1:PORT, once GET /v1/models answers
        ...                      # POST f"{url}/v1/completions", ...
    # here the server and anything it started are gone (server.pid names the process group)

The server runs in a session (process group) of its own, and leaving the block, however it is
left, ends the whole group: SIGTERM, then SIGKILL if it lingers. A serving benchmark can wrap its
load generator in the same block."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from trtbuild.builder.stages.gguf import read_serving

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def request_json(url: str, payload: Optional[dict] = None, timeout: float = 120.0) -> dict:
    """GET `url` (or POST `payload` as JSON) and the JSON answer."""
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return json.loads(response.read())


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (signal 0 checks without sending)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


class LlamaCppServer:
    def __init__(self, folder: Path, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        serving = read_serving(folder)
        assert serving is not None, f"{folder}: no serving/llamacpp_server.json"
        command = list(serving.command)
        # the packaged command names `python3`; the interpreter running the tests is the one with
        # llama-cpp-python installed (the demo_gguf fixture requires it), whatever PATH's python3 is
        if command[0] == "python3":
            command[0] = sys.executable
        self.folder = folder
        self.port = free_port()
        self.command = [*command, "--host", HOST, "--port", str(self.port)]
        self.url = f"http://{HOST}:{self.port}"
        self.ready_timeout_s = ready_timeout_s
        self.process: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None
        self._log = None

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        return "\n".join(Path(self._log.name).read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> str:
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llamacpp-server-", suffix=".log")
        try:
            # a session of its own: its pid is the group's id, and stopping the group stops whatever it started
            self.process = subprocess.Popen(self.command, cwd=self.folder, stdout=self._log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
            self.pid = self.process.pid
            self._wait_ready()
        except BaseException:
            self._stop()
            raise
        return self.url

    def __exit__(self, *exc) -> None:
        self._stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llama.cpp server exited with {self.process.returncode} before answering:\n"
                                   f"{self.log_tail()}")
            try:
                request_json(f"{self.url}/v1/models", timeout=5)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        raise RuntimeError(f"the llama.cpp server did not answer GET /v1/models within {self.ready_timeout_s} s:\n"
                           f"{self.log_tail()}")

    def _stop(self) -> None:
        try:
            if self.process is not None:
                for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
                    if not group_alive(self.pid):
                        break
                    os.killpg(self.pid, sig)
                    deadline = time.monotonic() + wait_s
                    while group_alive(self.pid) and time.monotonic() < deadline:
                        self.process.poll()  # reaps the leader, else it stays a zombie of the group
                        time.sleep(0.05)
                self.process.wait(timeout=STOP_TIMEOUT_S)
        finally:
            if self._log is not None:
                self._log.close()  # a NamedTemporaryFile: closing removes it
