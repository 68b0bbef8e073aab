"""Abort on disconnect, overload (429) and drain on SIGTERM, on the real server."""
import signal
import threading

import httpx
import openai
import pytest

from conftest import API_KEY, MODEL_NAME, Server, wait_for

H = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
        "stream": True}


def test_abort_on_disconnect(server):
    aborts_before = server.metric("deepinfer:request_success_total", finished_reason="abort")
    with httpx.stream("POST", server.url + "/v1/completions", json=LONG, headers=H, timeout=60) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
            if got >= 3:
                break
        assert server.metric("deepinfer:num_requests_running") >= 1
        assert server.metric("deepinfer:kv_cache_usage_perc") > 0
    # The client has gone: the request is aborted and its KV freed.
    assert wait_for(lambda: server.metric("deepinfer:num_requests_running") == 0
                    and server.metric("deepinfer:kv_cache_usage_perc") == 0)
    assert server.metric("deepinfer:request_success_total", finished_reason="abort") == aborts_before + 1
    # Far fewer tokens than asked for were generated.
    assert server.metric("deepinfer:generation_tokens_total") < 400 + 1000


def test_overload_429():
    s = Server("--max-num-seqs", "1", "--max-waiting", "0", "--api-key", API_KEY)
    try:
        with httpx.stream("POST", s.url + "/v1/completions", json=LONG, headers=H, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept referenced: dropping the iterator closes the response
            next(lines)
            client = openai.OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0)
            with pytest.raises(openai.RateLimitError) as e:
                client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
            assert e.value.status_code == 429 and e.value.body["type"] == "rate_limit_error"
        assert wait_for(lambda: s.metric("deepinfer:num_requests_running") == 0)
        # Capacity is back once the first request is gone.
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0)
        assert client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices[0].text is not None
        assert s.metric("deepinfer:num_requests_rejected_total") == 1
    finally:
        s.stop()


def test_drain_on_sigterm():
    s = Server("--shutdown-timeout", "60", "--api-key", API_KEY)
    try:
        result = {}
        started = threading.Event()

        def stream():
            body = dict(LONG, max_tokens=24)
            with httpx.stream("POST", s.url + "/v1/completions", json=body, headers=H, timeout=120) as r:
                chunks = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
                        started.set()
                result["chunks"] = chunks

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(30)
        s.proc.send_signal(signal.SIGTERM)
        # New connections are refused while the request in flight finishes.
        assert wait_for(lambda: refused(s.url), timeout=10)
        t.join(120)
        assert result["chunks"][-1] == "[DONE]"
        assert '"finish_reason":"length"' in result["chunks"][-2]
        assert s.proc.wait(60) == 0
    finally:
        s.stop()


def refused(url):
    try:
        httpx.get(url + "/health", timeout=1)
        return False
    except httpx.ConnectError:
        return True


def test_kv_exhaustion_preempts_and_never_fails():
    s = Server("--kv-cache-tokens", "256", "--max-model-len", "256", "--max-num-seqs", "8", "--api-key", API_KEY)
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        results = [None] * 8

        def run(i):
            results[i] = client.completions.create(model=MODEL_NAME, prompt=f"Story number {i}: once upon a time",
                                                   max_tokens=40, temperature=0, extra_body={"ignore_eos": True})

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert all(r is not None and r.choices[0].finish_reason == "length" for r in results)
        assert all(r.usage.completion_tokens == 40 for r in results)
        assert s.metric("deepinfer:num_preemptions_total") > 0
        assert s.metric("deepinfer:kv_cache_usage_perc") == 0
    finally:
        s.stop()
