#!/usr/bin/env python3
"""Prefill/decode disaggregation on one GPU (docs/router.md, docs/benchmarks.md
"Router and disaggregation"). Two `deepinfer serve` processes share the GPU,
one --role prefill and one --role decode, with a KV block directory on a
tmpfs between them, behind `deepinfer router`; against one colocated engine.

  1. Handoff: N prompts of P random tokens (max_tokens 1), each once through
     the colocated engine and once through the router. The KV bytes of a
     prompt over the time disaggregation adds to its time to first token is
     the handoff's effective bandwidth, beside the device's own copy
     bandwidth (measured here with torch when it is installed) and the
     decode engine's own disk-tier read rate.
  2. Decode latency under prefill-heavy load: S streams (short prompts,
     G output tokens each) decode while a new P-token prompt arrives every
     --interval seconds. Inter-token latency p50/p99 of the streams, measured
     at the client, colocated vs disaggregated.

Usage: scripts/gpu_disagg.py --deepinfer BIN --model DIR --out DIR [--device cuda]
Writes disagg.json and disagg.md into --out.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, path, log_path, timeout=400):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {timeout} s")


class Proc:
    def __init__(self, cmd, ready_path, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "a")
        self.log.write(f"\n=== {' '.join(cmd)}\n")
        self.log.flush()
        self.proc = subprocess.Popen(cmd + ["--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.url, self.proc, ready_path, log_path)

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def metric_sum(m, name, **labels):
    return sum(v for k, v in m.items()
               if k.split("{", 1)[0] == name and all(f'{a}="{b}"' in k for a, b in labels.items()))


def complete(url, ids, max_tokens=1):
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        json.loads(r.read())
    return time.perf_counter() - t0


def stream_gaps(url, ids, max_tokens, gaps, errors):
    """One streaming completion; appends the gaps between content events (seconds)."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        errors.append(f"HTTP {r.status}")
        return
    last = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            errors.append(str(ev["error"]))
            return
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
    conn.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def loaded_run(url, vocab, a, rng):
    """Decode streams under a stream of long prompts; returns ITL stats."""
    gaps, errors = [], []
    streams = [threading.Thread(target=stream_gaps,
                                args=(url, [rng.randrange(3, vocab) for _ in range(128)], a.gen, gaps, errors))
               for _ in range(a.streams)]
    for t in streams:
        t.start()
    time.sleep(0.5)  # the streams are decoding
    prefills = []
    stop = time.time() + a.load_seconds
    while time.time() < stop and any(t.is_alive() for t in streams):
        ids = [rng.randrange(3, vocab) for _ in range(a.prompt)]
        t = threading.Thread(target=complete, args=(url, ids, 1))
        t.start()
        prefills.append(t)
        time.sleep(a.interval)
    for t in streams + prefills:
        t.join()
    return {"itl_p50_ms": pct(gaps, 0.5) * 1e3, "itl_p99_ms": pct(gaps, 0.99) * 1e3,
            "itl_p999_ms": pct(gaps, 0.999) * 1e3, "itl_max_ms": max(gaps) * 1e3 if gaps else float("nan"),
            "itl_mean_ms": statistics.mean(gaps) * 1e3 if gaps else float("nan"), "gaps": len(gaps),
            "long_prompts": len(prefills), "errors": errors[:3]}


def save(out, result):
    """Partial results survive a timeout."""
    with open(os.path.join(out, "disagg.json"), "w") as f:
        json.dump(result, f, indent=2)


def device_copy_gbs():
    try:
        import torch
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        y.copy_(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            y.copy_(x)
        torch.cuda.synchronize()
        d2d = 20 * x.numel() / (time.perf_counter() - t0) / 1e9
        h = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        t0 = time.perf_counter()
        for _ in range(5):
            x.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        h2d = 5 * x.numel() / (time.perf_counter() - t0) / 1e9
        del x, y, h
        torch.cuda.empty_cache()
        return d2d, h2d
    except Exception as e:  # no torch or no GPU: reported as missing
        print(f"device copy bandwidth not measured: {e}")
        return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--gen", type=int, default=3000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--load-seconds", type=float, default=20)
    ap.add_argument("--mem", default="0.42", help="--gpu-memory-utilization of each engine")
    ap.add_argument("--extra", default="", help="more serve flags for every engine")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "disagg.log")
    vocab = json.load(open(os.path.join(a.model, "config.json"))).get("vocab_size", 32000) if os.path.isdir(a.model) else 32000
    # The handoff directory: a tmpfs when it has room, else the temp directory.
    shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    base = "/dev/shm" if shm_free > (8 << 30) else tempfile.gettempdir()
    kv_dir = tempfile.mkdtemp(prefix="deepinfer-kv-", dir=base)
    d2d, h2d = device_copy_gbs() if a.device == "cuda" else (None, None)
    common = [a.deepinfer, "serve", "--device", a.device, "--model", a.model, "--served-model-name", "m",
              "--max-model-len", str(a.prompt + a.gen + 64), "--max-body-bytes", str(64 << 20)] + a.extra.split()
    if a.device == "cuda":
        common += ["--gpu-memory-utilization", a.mem]
    result = {"prompt_tokens": a.prompt, "kv_dir": base, "device_copy_gbs": d2d, "host_to_device_gbs": h2d}
    rng = random.Random(3)
    prompts = [[rng.randrange(3, vocab) for _ in range(a.prompt)] for _ in range(a.prompts)]
    procs = []
    try:
        # Colocated: one engine does both.
        colo = Proc(common, "/ready", log)
        procs.append(colo)
        complete(colo.url, prompts[0][:256], 1)  # warm-up
        colo_ttft = [complete(colo.url, p, 1) for p in prompts]
        result["colocated_ttft_s"] = statistics.median(colo_ttft)
        result["colocated_load"] = loaded_run(colo.url, vocab, a, random.Random(5))
        save(a.out, result)
        colo.stop()
        procs.remove(colo)
        # Disaggregated: a prefill and a decode engine on the same GPU, a router in front.
        tiers = ["--kv-cache-dir", kv_dir, "--kv-offloading-size", "8"]
        # --gpu-memory-utilization counts the whole device's memory, the other
        # engine's included: the second engine gets twice the first's share.
        pre = Proc(common + ["--role", "prefill"] + tiers, "/ready", log)
        procs.append(pre)
        second = common[:-1] + [str(min(0.95, 2 * float(a.mem)))] if a.device == "cuda" else common
        dec = Proc(second + ["--role", "decode"] + tiers, "/ready", log)
        procs.append(dec)
        router = Proc([a.deepinfer, "router", "--backend", pre.url, "--backend", dec.url, "--health-interval", "0.5"],
                      "/health", log)
        procs.append(router)
        complete(router.url, prompts[0][:256], 1)
        before = dec.metrics()
        fresh = [[rng.randrange(3, vocab) for _ in range(a.prompt)] for _ in range(a.prompts)]
        dis_ttft = [complete(router.url, p, 1) for p in fresh]
        after = dec.metrics()
        loaded_tokens = metric_sum(after, "deepinfer:kv_tier_hit_tokens_total") - metric_sum(before, "deepinfer:kv_tier_hit_tokens_total")
        read_bytes = metric_sum(after, "deepinfer:kv_tier_read_bytes_total", tier="disk") - \
            metric_sum(before, "deepinfer:kv_tier_read_bytes_total", tier="disk")
        onload_s = metric_sum(after, "deepinfer:kv_tier_onload_seconds_total") - \
            metric_sum(before, "deepinfer:kv_tier_onload_seconds_total")
        bytes_per_prompt = read_bytes / max(1, a.prompts)
        extra_s = statistics.median(dis_ttft) - result["colocated_ttft_s"]
        result.update({
            "disaggregated_ttft_s": statistics.median(dis_ttft),
            "handoff_loaded_tokens_per_prompt": loaded_tokens / a.prompts,
            "handoff_bytes_per_prompt": bytes_per_prompt,
            "handoff_added_s": extra_s,
            "handoff_effective_gbs": bytes_per_prompt / extra_s / 1e9 if extra_s > 0 else None,
            "decode_disk_read_gbs": read_bytes / onload_s / 1e9 if onload_s > 0 else None,
            "kv_export": {k: v for k, v in pre.metrics().items() if "kv_export" in k},
        })
        save(a.out, result)
        result["disaggregated_load"] = loaded_run(router.url, vocab, a, random.Random(5))
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(kv_dir, ignore_errors=True)
    save(a.out, result)

    def g(x, f="{:.1f}"):
        return "n/a" if x is None else f.format(x)
    lines = [
        f"- prompt {a.prompt} tokens; KV handoff directory on {base}; engines at --gpu-memory-utilization {a.mem}",
        f"- device copy {g(d2d)} GB/s, pinned host-to-device {g(h2d)} GB/s (torch, same GPU)",
        f"- TTFT colocated {result['colocated_ttft_s'] * 1e3:.0f} ms, disaggregated {result['disaggregated_ttft_s'] * 1e3:.0f} ms "
        f"(+{result['handoff_added_s'] * 1e3:.0f} ms for {result['handoff_bytes_per_prompt'] / 2**20:.0f} MiB of KV: "
        f"{g(result['handoff_effective_gbs'], '{:.2f}')} GB/s effective; the decode engine's reads "
        f"{g(result['decode_disk_read_gbs'], '{:.2f}')} GB/s; {result['handoff_loaded_tokens_per_prompt']:.0f} prompt tokens loaded per request)",
        "",
        f"| {a.streams} streams × {a.gen} tokens, a {a.prompt}-token prompt every {a.interval} s | ITL p50 | ITL p99 | p99.9 | max | mean | long prompts |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("colocated", "disaggregated"):
        r = result[f"{name}_load"]
        lines.append(f"| {name} | {r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms | {r['itl_p999_ms']:.1f} ms | "
                     f"{r['itl_max_ms']:.1f} ms | {r['itl_mean_ms']:.1f} ms | "
                     f"{r['long_prompts']}{' errors: ' + str(r['errors']) if r['errors'] else ''} |")
    with open(os.path.join(a.out, "disagg.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
