"""A real vLLM server over the tiny model, as the rollout tests start it (imported by them and by
conftest.py's session server): the documented ``vllm serve`` line (`serve_command`) in a process
group of its own, fp32, once it answers ``/health``."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

START_S = 600  # vLLM's start on two busy cores
GROUP = "vllm_server"  # the xdist group of the files using conftest's `session_server` (tests/conftest.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder):
    """A vLLM server over the tiny model (seed 0) in ``folder``, in its own process group, once it
    answers: ``(process, url)``."""
    import requests

    from ibpo_lit.models import build_tiny_model, build_tiny_tokenizer
    from ibpo_lit.rollout.vllm_server import launch, serve_command

    build_tiny_model(seed=0).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    port = free_port()
    argv, env = serve_command(str(folder), port, dtype="float32", max_model_len=512, on_gpu=False)
    process = launch(argv, env, str(folder / "server.log"))
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    while True:
        if process.poll() is not None:
            pytest.fail(f"the vLLM server exited ({process.returncode}): {(folder / 'server.log').read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return process, url
        except requests.RequestException:
            pass
        if time.monotonic() - start > START_S:
            stop_server(process)
            pytest.fail(f"the vLLM server did not start in {START_S} s")
        time.sleep(2)


def stop_server(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class SessionServer:
    """One server for every test file that asks (vLLM on the CPU takes a minute or more to start):
    `get` starts it on the first call, and again after a test ended it (test_vllm_server's
    kill test), so no test depends on which ran before it. Each test attaches and syncs its own
    weights first, as a run does; what an earlier test left in the server is overwritten."""

    def __init__(self, folders):
        self.folders, self.process, self.url = folders, None, None

    def get(self):
        if self.process is None or self.process.poll() is not None:
            self.process, self.url = start_server(self.folders.mktemp("served_model"))
        return self.process, self.url

    def close(self):
        if self.process is not None:
            stop_server(self.process)
