"""Starts the real `deepinfer serve` binary for the server tests.

The binary is $DEEPINFER_BIN or build/deepinfer; the model is the built-in
default (SmolLM2-135M-Instruct), passed explicitly so a binary outside the
repository's build folder finds it too.
"""
import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import time

import httpx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
API_KEY = "test-key"
MODEL_NAME = "smollm2"


def tool_call_shots(*cities):
    """A conversation that makes the 135M model call get_weather: on its own it
    rarely does, but after a few earlier turns that called it in its template's
    format (Hermes <tool_call> tags, written here as plain assistant text) it
    answers the last question with the same call, once per city, greedily.
    Plain user/assistant text, so the chat, Responses and Anthropic APIs all take it."""
    def call(city):
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % city
    shots = [("Paris", "Rome"), ("Berlin", "Madrid")] if len(cities) == 2 else [("Paris",), ("Rome",), ("Berlin",)]
    messages = []
    for shot in shots:
        messages += [{"role": "user", "content": f"Weather in {' and '.join(shot)}?"},
                     {"role": "assistant", "content": "\n".join(call(c) for c in shot)},
                     {"role": "user", "content": "sunny"},
                     {"role": "assistant", "content": "Sunny."}]
    return messages + [{"role": "user", "content": f"Weather in {' and '.join(cities)}?"}]


def wait_for(fn, timeout=30):
    """Polls fn until it is true or timeout seconds pass; returns whether it became true."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if fn():
            return True
        time.sleep(0.05)
    return False


def binary():
    path = pathlib.Path(os.environ.get("DEEPINFER_BIN", ROOT / "build" / "deepinfer"))
    if not path.exists():
        raise RuntimeError(f"server binary {path} not found: run ./build.sh or set DEEPINFER_BIN")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched_ranks(tmp_path, args, world=2, timeout_s=10):
    """`world` processes running `args`, started as torchrun starts them (RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT), each logging to
    tmp_path/rank<r>.log; whichever are still running are killed at the end."""
    base = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "DEEPINFER_DIST_TIMEOUT_S": str(timeout_s)}
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(world)]
    procs = [subprocess.Popen(args, stdout=logs[r], stderr=subprocess.STDOUT,
                              env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(world)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


def answers_ready(url):
    try:
        return httpx.get(url + "/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Server:
    def __init__(self, *extra, model=None, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model = pathlib.Path(model) if model else ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        args = [str(binary()), "serve", "--port", str(self.port), "--served-model-name", MODEL_NAME]
        if "--threads" not in extra:
            args += ["--threads", "2"]
        if model.exists():
            args += ["--model", str(model)]
        args += list(extra)
        self.log_path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"deepinfer-serve-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=None if env is None else {**os.environ, **env})
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become ready in 60 s")

    def metrics(self):
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line.startswith("#") or not line:
                continue
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
        return values

    def metric(self, name, **labels):
        for series, value in self.metrics().items():
            base = series.split("{", 1)[0]
            if base == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
                return value
        raise KeyError(name)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def server():
    s = Server("--api-key", API_KEY)
    yield s
    s.stop()


@pytest.fixture()
def openai_client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture()
def anthropic_client(server):
    import anthropic
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)
