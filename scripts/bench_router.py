#!/usr/bin/env python3
"""Cache-aware routing vs round-robin over replicas, on a multi-turn trace.

Starts R replicas of `deepinfer serve` (the default model unless --model) and
a `deepinfer router` in front of them, once per routing policy (fresh
replicas each time, so both start cold), and replays the same trace through
the router: C conversations in G groups, each group sharing a long system
prompt; every turn adds a user message and the previous answer, and turns
run K conversations at a time. Reports per policy the prefix-cache hit rate
(cached prompt tokens / prompt tokens, from each answer's usage) and the
mean and p90 time to first token, measured at the client.

  python3 scripts/bench_router.py [--bin build/deepinfer] [--replicas 4] [--conversations 16]
      [--groups 4] [--turns 4] [--concurrency 4] [--threads 1] [--policies cache_aware,round_robin]
      [--json out.json]

Only loopback addresses are used; every process is stopped at the end.
"""
import argparse
import concurrent.futures
import json
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORDS = ("river stone lamp orbit cedar quartz meadow signal harbor lattice ember canyon velvet prism tundra "
         "cobalt willow beacon fjord saffron glacier mosaic thistle nimbus").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, path, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready in {timeout} s")


def start(args, url, ready_path, log):
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    wait_ready(url, proc, ready_path)
    return proc


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def make_trace(a, rng):
    systems = [" ".join(rng.choice(WORDS) for _ in range(a.system_words)) for _ in range(a.groups)]
    convs = []
    for c in range(a.conversations):
        convs.append({"system": f"You are assistant {c % a.groups}. Reference notes: " + systems[c % a.groups],
                      "questions": [f"Question {t} of conversation {c}: " +
                                    " ".join(rng.choice(WORDS) for _ in range(a.question_words))
                                    for t in range(a.turns)]})
    return convs


def run_turn(url, conv, history, turn, max_tokens):
    messages = [{"role": "system", "content": conv["system"]}] + history + [
        {"role": "user", "content": conv["questions"][turn]}]
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    text = ""
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"])
            for ch in ev.get("choices", []):
                piece = ch["delta"].get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            if ev.get("usage"):
                usage = ev["usage"]
    history += [{"role": "user", "content": conv["questions"][turn]}, {"role": "assistant", "content": text}]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "prompt": usage["prompt_tokens"],
            "cached": cached}


def run_policy(a, policy, trace):
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="deepinfer-bench-router-"))
    procs = []
    try:
        replicas = []
        for i in range(a.replicas):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [a.bin, "serve", "--port", str(port), "--served-model-name", "default", "--threads", str(a.threads),
                   "--kv-cache-tokens", str(a.kv_cache_tokens)]
            if a.model:
                cmd += ["--model", a.model]
            procs.append(start(cmd, url, "/ready", open(logdir / f"replica{i}.log", "w")))
            replicas.append(url)
        port = free_port()
        router = f"http://127.0.0.1:{port}"
        cmd = [a.bin, "router", "--port", str(port), "--policy", policy] + sum((["--backend", u] for u in replicas), [])
        procs.append(start(cmd, router, "/health", open(logdir / "router.log", "w")))
        results = []
        histories = [[] for _ in trace]
        t0 = time.perf_counter()
        for turn in range(a.turns):
            with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
                futs = [pool.submit(run_turn, router, conv, histories[i], turn, a.max_tokens) for i, conv in enumerate(trace)]
                results += [f.result() for f in futs]
        wall = time.perf_counter() - t0
        ttfts = sorted(r["ttft"] for r in results)
        return {"policy": policy, "requests": len(results),
                "hit_rate": sum(r["cached"] for r in results) / max(1, sum(r["prompt"] for r in results)),
                "prompt_tokens": sum(r["prompt"] for r in results),
                "mean_ttft_s": statistics.mean(ttfts), "p90_ttft_s": ttfts[int(0.9 * (len(ttfts) - 1))],
                "wall_s": wall}
    finally:
        stop(procs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "build" / "deepinfer"))
    p.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--system-words", type=int, default=600)
    p.add_argument("--question-words", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--kv-cache-tokens", type=int, default=16384)
    p.add_argument("--policies", default="cache_aware,round_robin")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args()
    trace = make_trace(a, random.Random(a.seed))
    rows = [run_policy(a, policy, trace) for policy in a.policies.split(",")]
    print(f"{a.replicas} replicas, {a.conversations} conversations in {a.groups} system-prompt groups, "
          f"{a.turns} turns, {a.concurrency} at a time")
    print(f"{'policy':<12} {'requests':>8} {'hit rate':>9} {'mean TTFT':>10} {'p90 TTFT':>9} {'wall':>7}")
    for r in rows:
        print(f"{r['policy']:<12} {r['requests']:>8} {r['hit_rate']:>9.1%} {r['mean_ttft_s'] * 1000:>8.0f}ms "
              f"{r['p90_ttft_s'] * 1000:>7.0f}ms {r['wall_s']:>6.1f}s")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
