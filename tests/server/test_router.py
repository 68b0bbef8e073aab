"""`deepinfer router` over real `deepinfer serve` processes on localhost.

Two prefill and two decode engines of the default model share a KV block
directory (on tmpfs when there is one); a router in front runs each request
on a prefill engine, then on a decode engine that finds the prompt's KV in
the directory. Every engine (and the single engine the answers are compared
with) runs with DEEPINFER_BATCH_INVARIANT=1, so a prompt whose KV came from
another process gives exactly the tokens a cold run gives.
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

import httpx
import pytest

from conftest import MODEL_NAME, Server, binary, free_port, wait_for

INVARIANT = {"DEEPINFER_BATCH_INVARIANT": "1"}
PROMPTS = [
    "Name three colours of the rainbow.",
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Explain what a prime number is to a child.",
]


class Router:
    def __init__(self, backends, *extra, need_backend=True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [str(binary()), "router", "--port", str(self.port)]
        for b in backends:
            args += ["--backend", b.url]
        args += list(extra)
        self.log_path = pathlib.Path(tempfile.gettempdir()) / f"deepinfer-router-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        # /health answers 200 only with a backend up; /router/backends once listening.
        ok = wait_for(lambda: self._healthy("/health" if need_backend else "/router/backends"), timeout=30)
        assert ok, self.log_path.read_text()

    def _healthy(self, path):
        if self.proc.poll() is not None:
            raise RuntimeError(f"router exited: {self.log_path.read_text()}")
        try:
            return httpx.get(self.url + path, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def backends(self):
        return httpx.get(self.url + "/router/backends", timeout=5).json()["backends"]

    def metric(self, name, **labels):
        total = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("#") or not line:
                continue
            series, value = line.rsplit(" ", 1)
            if series.split("{", 1)[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def cluster():
    shm = pathlib.Path("/dev/shm")
    kv_dir = tempfile.mkdtemp(prefix="deepinfer-kv-", dir=shm if shm.is_dir() else None)
    started = []
    try:
        common = ["--kv-cache-dir", kv_dir, "--threads", "1"]
        reference = Server("--threads", "1", env=INVARIANT)
        started.append(reference)
        prefill = [Server("--role", "prefill", *common, env=INVARIANT) for _ in range(2)]
        started += prefill
        decode = [Server("--role", "decode", *common, env=INVARIANT) for _ in range(2)]
        started += decode
        router = Router(prefill + decode, "--health-interval", "0.2")
        wait_for(lambda: all(b["healthy"] for b in router.backends()), timeout=20)
        yield {"reference": reference, "prefill": prefill, "decode": decode, "router": router, "dir": kv_dir}
        router.stop()
    finally:
        for s in started:
            s.stop()
        subprocess.run(["rm", "-rf", kv_dir], check=False)


def chat(url, prompt, **extra):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24,
            "temperature": 0, **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def chat_stream(url, prompt, max_tokens=24):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    text = ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for choice in event["choices"]:
                text += choice["delta"].get("content") or ""
    return text


def test_router_learns_roles_and_model(cluster):
    router = cluster["router"]
    roles = sorted(b["role"] for b in router.backends())
    assert roles == ["decode", "decode", "prefill", "prefill"]
    models = httpx.get(router.url + "/v1/models", timeout=5).json()["data"]
    assert [m["id"] for m in models] == [MODEL_NAME]
    info = httpx.get(cluster["prefill"][0].url + "/server_info", timeout=5).json()
    assert info["role"] == "prefill" and info["kv_cache_dir"] is True


def test_disaggregated_greedy_output_equals_one_engine(cluster):
    router, reference = cluster["router"], cluster["reference"]
    for prompt in PROMPTS:
        assert chat(router.url, prompt) == chat(reference.url, prompt), prompt
        assert chat_stream(router.url, prompt) == chat(reference.url, prompt), prompt
    assert router.metric("deepinfer_router:disaggregated_requests_total") >= 2 * len(PROMPTS)
    assert router.metric("deepinfer_router:kv_handoffs_total", kv_exported="true") >= 2 * len(PROMPTS)
    # The decode engines loaded the prompts' KV from the shared directory instead of computing it.
    loaded = sum(d.metric("deepinfer:kv_tier_hit_tokens_total") for d in cluster["decode"])
    assert loaded >= 16 * len(PROMPTS)


def test_completions_and_anthropic_through_the_router(cluster):
    router, reference = cluster["router"], cluster["reference"]
    body = {"model": MODEL_NAME, "prompt": "The three primary colours are", "max_tokens": 16, "temperature": 0}
    a = httpx.post(router.url + "/v1/completions", json=body, timeout=120).json()
    b = httpx.post(reference.url + "/v1/completions", json=body, timeout=120).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    import anthropic
    texts = []
    for url in (router.url, reference.url):
        client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)
        msg = client.messages.create(model=MODEL_NAME, max_tokens=16, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": "Say hello to the team."}])
        texts.append(msg.content[0].text)
    assert texts[0] == texts[1]
    # Errors come back in the API's own format, from the router or the backend.
    r = httpx.post(router.url + "/v1/chat/completions", json={"model": "no-such-model", "messages": []}, timeout=30)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(router.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(router.url + "/v1/chat/completions", json={"model": MODEL_NAME, "messages": [], "max_tokens": -3},
                   timeout=30)
    assert r.status_code == 400, r.text


def test_client_abort_stops_the_generation_on_the_backend(cluster):
    router = cluster["router"]
    aborted_before = sum(d.metric("deepinfer:request_success_total", finished_reason="abort") for d in cluster["decode"])
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell a very long story."}],
            "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=120) as r:
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks += 1
            if chunks >= 3:
                break
    # Closing the client's connection cancels the router's call, and the decode engine aborts.
    assert wait_for(lambda: sum(d.metric("deepinfer:request_success_total", finished_reason="abort")
                                for d in cluster["decode"]) > aborted_before, timeout=20)
    assert wait_for(lambda: all(b["in_flight"] == 0 for b in router.backends()), timeout=10)
    assert chat(router.url, PROMPTS[0]) == chat(cluster["reference"].url, PROMPTS[0])


def test_drained_backend_takes_no_new_requests(cluster):
    router = cluster["router"]
    target = cluster["decode"][0].url
    assert httpx.post(router.url + "/router/drain", json={"url": target}, timeout=5).status_code == 200
    before = cluster["decode"][0].metric("deepinfer:request_success_total", finished_reason="length")
    for prompt in PROMPTS[:3]:
        chat(router.url, prompt, max_tokens=4)
    assert cluster["decode"][0].metric("deepinfer:request_success_total", finished_reason="length") == before
    assert httpx.post(router.url + "/router/undrain", json={"url": target}, timeout=5).status_code == 200
    assert httpx.post(router.url + "/router/drain", json={"url": "http://nowhere:1"}, timeout=5).status_code == 404


def test_killed_backend_loses_no_request_that_had_not_started(cluster):
    # A second router that checks health rarely, so it still believes in the
    # killed engine and finds out only by calling it.
    router = Router(cluster["prefill"] + cluster["decode"], "--policy", "round_robin", "--health-interval", "60")
    try:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell a very long story."}],
                "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True}
        lines = []
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=120) as r:
            it = r.iter_lines()
            while sum(1 for x in lines if x.startswith("data: ")) < 3:
                lines.append(next(it))
            busy = [b["url"] for b in router.backends() if b["role"] == "decode" and b["in_flight"] == 1]
            assert len(busy) == 1
            victim = next(d for d in cluster["decode"] if d.url == busy[0])
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            lines += list(it)
        # The request that had started there ends with a clean error event.
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
        assert "error" in events[-1], events[-1]
        # Requests that had not started there: retried elsewhere, none lost.
        for prompt in PROMPTS:
            assert chat(router.url, prompt) == chat(cluster["reference"].url, prompt)
        assert router.metric("deepinfer_router:retries_total") >= 1
        assert any(not b["healthy"] for b in router.backends())
    finally:
        router.stop()


def handoff_pair(cluster, prefill_args, decode_args):
    """A prefill and a decode engine behind a router, handing KV over as the
    arguments say; yields them with the cluster's single reference engine."""
    started = []
    try:
        prefill = Server("--role", "prefill", *prefill_args, env=INVARIANT)
        started.append(prefill)
        decode = Server("--role", "decode", *decode_args, env=INVARIANT)
        started.append(decode)
        router = Router([prefill, decode], "--health-interval", "0.2")
        wait_for(lambda: all(b["healthy"] for b in router.backends()), timeout=20)
        yield {"reference": cluster["reference"], "prefill": prefill, "decode": decode, "router": router}
        router.stop()
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def shared_pair(cluster):
    """A prefill and a decode engine handing KV over through the prefill
    engine's shared pool (--kv-transport shared): no directory at all."""
    common = ["--kv-transport", "shared", "--threads", "1"]
    # On the CPU the pool lives in /dev/shm itself (64 MiB in many
    # containers): 20 MiB holds ~58 blocks of this model, plenty here.
    yield from handoff_pair(cluster, common + ["--kv-transport-size", "0.02"], common)


def test_shared_pool_handoff_gives_the_outputs_of_one_engine(shared_pair):
    router, reference = shared_pair["router"], shared_pair["reference"]
    info = httpx.get(shared_pair["prefill"].url + "/server_info", timeout=5).json()
    assert info["kv_shared_pool"].startswith("deepinfer-kv-") and info["kv_cache_dir"] is False
    pool = pathlib.Path("/dev/shm") / info["kv_shared_pool"]
    assert pool.exists()
    for prompt in PROMPTS:
        assert chat(router.url, prompt) == chat(reference.url, prompt), prompt
        assert chat_stream(router.url, prompt) == chat(reference.url, prompt), prompt
    assert router.metric("deepinfer_router:kv_handoffs_total", kv_exported="true") >= 2 * len(PROMPTS)
    decode = shared_pair["decode"]
    assert decode.metric("deepinfer:kv_peer_pools") == 1
    # The prompts' KV came out of the prefill engine's pool: at least one
    # 16-token block per prompt.
    assert decode.metric("deepinfer:kv_peer_loaded_blocks_total") >= len(PROMPTS)
    assert decode.metric("deepinfer:kv_tier_hit_tokens_total") >= 16 * len(PROMPTS)
    # A client naming a pool that is not one is ignored; the request runs.
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 8,
            "temperature": 0}
    for bogus in ["../../etc/passwd", "deepinfer-kv-1-1", "x" * 500]:
        r = httpx.post(decode.url + "/v1/chat/completions", json=body, headers={"x-deepinfer-kv-source": bogus},
                       timeout=120)
        assert r.status_code == 200, r.text
    assert decode.metric("deepinfer:kv_peer_pools") == 1
    # The prefill engine removes its pool when it ends.
    proc = shared_pair["prefill"].proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert not pool.exists()


@pytest.fixture(scope="module")
def ucx_pair(cluster):
    """A prefill and a decode engine handing KV over through UCX
    (--kv-transport ucx): the decode engine fetches each prompt's blocks from
    the prefill engine's host tier, as it would from another node."""
    common = ["--kv-transport", "ucx", "--kv-transport-size", "0.05", "--threads", "1"]
    yield from handoff_pair(cluster, common + ["--kv-transport-address", "127.0.0.1:0"], common)


def test_ucx_handoff_gives_the_outputs_of_one_engine(ucx_pair):
    router, reference = ucx_pair["router"], ucx_pair["reference"]
    prefill, decode = ucx_pair["prefill"], ucx_pair["decode"]
    source = httpx.get(prefill.url + "/server_info", timeout=5).json()["kv_export_source"]
    assert source.startswith("ucx://127.0.0.1:")
    for prompt in PROMPTS:
        assert chat(router.url, prompt) == chat(reference.url, prompt), prompt
        assert chat_stream(router.url, prompt) == chat(reference.url, prompt), prompt
    assert router.metric("deepinfer_router:kv_handoffs_total", kv_exported="true") >= 2 * len(PROMPTS)
    # Every prompt's KV was fetched over the transport (at least one 16-token
    # block each) and loaded instead of computed.
    assert decode.metric("deepinfer:kv_remote_fetch_failures_total") == 0
    assert decode.metric("deepinfer:kv_remote_fetched_blocks_total") >= len(PROMPTS)
    assert decode.metric("deepinfer:kv_tier_hit_tokens_total") >= 16 * len(PROMPTS)
    assert prefill.metric("deepinfer:kv_export_sent_blocks_total") >= len(PROMPTS)
    assert decode.metric("deepinfer:kv_remote_connections") == 1
    # Sources that are malformed or on hosts the decode engine does not trust
    # are never contacted; the requests run.
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 8,
            "temperature": 0}
    for bogus in ["ucx://10.255.255.1:9", "ucx://127.0.0.1", "ucx://127.0.0.1:99999", "ucx://" + "x" * 400 + ":1"]:
        r = httpx.post(decode.url + "/v1/chat/completions", json=body, headers={"x-deepinfer-kv-source": bogus},
                       timeout=120)
        assert r.status_code == 200, r.text
    assert decode.metric("deepinfer:kv_remote_refused_sources_total") == 4
    # A prefill engine that died: the fetch fails, the prompt is recomputed,
    # the answer is the same.
    prefill.proc.send_signal(signal.SIGKILL)
    prefill.proc.wait(timeout=30)
    prompt = "Name a large animal that lives in the sea."
    body["messages"][0]["content"] = prompt
    body["max_tokens"] = 24
    r = httpx.post(decode.url + "/v1/chat/completions", json=body, headers={"x-deepinfer-kv-source": source},
                   timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == chat(reference.url, prompt)
    assert decode.metric("deepinfer:kv_remote_fetch_failures_total") == 1


class Etcd:
    """A throwaway etcd (Debian's etcd-server, installed by build.sh)."""

    def __init__(self):
        exe = shutil.which("etcd")
        if exe is None:
            pytest.fail("etcd is not installed (build.sh installs Debian's etcd-server)")
        self.port, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = tempfile.mkdtemp(prefix="deepinfer-etcd-")
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [exe, "--data-dir", os.path.join(self.dir, "data"), "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        assert wait_for(self._up, timeout=30), open(os.path.join(self.dir, "etcd.log")).read()

    def _up(self):
        try:
            return httpx.post(self.url + "/v3/kv/range", json={"key": "AA=="}, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_backends_found_in_etcd_join_and_leave(cluster):
    """serve --etcd registers under a lease; router --etcd lists the key
    prefix every health interval: engines join when they start, leave when
    they stop (lease revoked) or die (lease expired)."""
    etcd = Etcd()
    started = []
    router = None
    try:
        router = Router([], "--etcd", etcd.url, "--health-interval", "0.2", need_backend=False)
        assert router.backends() == []
        first = Server("--etcd", etcd.url, "--threads", "1", env=INVARIANT)
        started.append(first)
        assert wait_for(lambda: [b["url"] for b in router.backends() if b["healthy"]] == [first.url], timeout=15)
        prompt = PROMPTS[1]
        assert chat(router.url, prompt) == chat(cluster["reference"].url, prompt)
        second = Server("--etcd", etcd.url, "--threads", "1", env=INVARIANT)
        started.append(second)
        assert wait_for(lambda: sorted(b["url"] for b in router.backends() if b["healthy"]) ==
                        sorted([first.url, second.url]), timeout=15)
        # A clean stop revokes the lease: gone at the next listing.
        first.proc.send_signal(signal.SIGTERM)
        first.proc.wait(timeout=60)
        assert wait_for(lambda: [b["url"] for b in router.backends()] == [second.url], timeout=10)
        assert chat(router.url, prompt) == chat(cluster["reference"].url, prompt)
        # A crash lets the lease (10 s) expire.
        second.proc.kill()
        second.proc.wait()
        assert wait_for(lambda: router.backends() == [], timeout=30)
        r = httpx.post(router.url + "/v1/chat/completions", timeout=30,
                       json={"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
        assert r.status_code == 503, r.text
    finally:
        if router:
            router.stop()
        for s in started:
            s.stop()
        etcd.stop()
