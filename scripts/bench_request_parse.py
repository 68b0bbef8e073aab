#!/usr/bin/env python3
"""Cost of hostile request bodies on the server, and whether /health stays
responsive while they are sent (issue "Hardening", goal: health <= 50 ms).

For each binary given (e.g. the current build and an older one, as a same-run
comparison), starts `deepinfer serve` on the default model and measures:
  - the time to answer a chat request carrying an unknown field that is an
    object of N keys (it is ignored; max_tokens 1),
  - the time to reject a request whose logit_bias has N entries (400),
  - /health latency on its own connection, polled every 10 ms while C
    clients send those two requests R times each.

    scripts/bench_request_parse.py [--keys 100000] [--clients 4] [--rounds 3] BIN [BIN ...]
"""
import argparse
import pathlib
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary):
    port = free_port()
    args = [binary, "serve", "--port", str(port), "--served-model-name", "m", "--threads", "2"]
    if MODEL.exists():
        args += ["--model", str(MODEL)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{binary} did not become ready")


def bodies(keys):
    obj = "{" + ",".join('"%d":1' % i for i in range(keys)) + "}"
    head = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"temperature":0'
    return {"unknown_field": head + ',"junk":' + obj + "}", "logit_bias": head + ',"logit_bias":' + obj + "}"}


def post(url, body, timeout=600):
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                   timeout=timeout)
    return r.status_code, time.perf_counter() - t0


def measure(binary, keys, clients, rounds):
    proc, url = start(binary)
    try:
        b = bodies(keys)
        alone = {name: post(url, body) for name, body in b.items()}
        latencies = []
        done = threading.Event()

        def load():
            for _ in range(rounds):
                for body in b.values():
                    post(url, body)

        threads = [threading.Thread(target=load) for _ in range(clients)]
        for t in threads:
            t.start()

        def watcher():
            for t in threads:
                t.join()
            done.set()

        threading.Thread(target=watcher).start()
        with httpx.Client(timeout=600) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                c.get(url + "/health")
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.01)
        latencies.sort()
        return {"alone": alone, "health_p50_ms": 1e3 * statistics.median(latencies),
                "health_p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
                "health_max_ms": 1e3 * latencies[-1], "health_polls": len(latencies),
                "load_bytes": sum(len(x) for x in b.values()) * clients * rounds}
    finally:
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--keys", type=int, default=100000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(f"{a.keys} keys per object; {a.clients} clients x {a.rounds} rounds of both bodies "
          f"({len(bodies(a.keys)['logit_bias']) / 1e6:.2f} MB each)")
    print("| binary | unknown field: status, s | logit_bias: status, s | /health p50 / p99 / max ms under load |")
    print("|---|---|---|---|")
    for binary in a.binaries:
        m = measure(binary, a.keys, a.clients, a.rounds)
        u, l = m["alone"]["unknown_field"], m["alone"]["logit_bias"]
        print(f"| {binary} | {u[0]}, {u[1]:.3f} | {l[0]}, {l[1]:.3f} | "
              f"{m['health_p50_ms']:.1f} / {m['health_p99_ms']:.1f} / {m['health_max_ms']:.1f} ({m['health_polls']} polls) |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
