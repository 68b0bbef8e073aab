#!/usr/bin/env python3
"""Prefill/decode disaggregation on one GPU (docs/router.md, docs/benchmarks.md
"Router and disaggregation"). Two `deepinfer serve` processes share the GPU,
one --role prefill and one --role decode, behind `deepinfer router`, against
one colocated engine; the KV moves between them by each --transport in turn:
directory (block files on a tmpfs) and shared (the prefill engine's shared
pool in device memory, mapped by the decode engine over CUDA IPC).

  1. Handoff: N prompts of P random tokens (max_tokens 1), each once through
     the colocated engine and once through the router. The KV bytes of a
     prompt over the time disaggregation adds to its time to first token is
     the handoff's effective bandwidth, beside the device's own copy
     bandwidth (measured here with torch when it is installed); and the
     decode engine's own load rate into its pages (device time of its
     sampled load batches, deepinfer:kv_load_timed_*).
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


def complete(url, ids, max_tokens=1, text=None):
    """Seconds one greedy completion takes; its text is appended to `text` when given."""
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.loads(r.read())
    if text is not None:
        text.append(answer["choices"][0]["text"])
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


def disaggregated(a, common, transport, kv_dir, prompts, vocab, rng, procs, log):
    """A prefill and a decode engine on the same GPU, a router in front: the
    handoff's cost in time to first token, then decode latency under load."""
    r = {}
    if transport == "shared":
        pre_flags = ["--kv-transport", "shared", "--kv-transport-size", a.pool_gib]
        dec_flags = ["--kv-transport", "shared"]
    else:
        pre_flags = dec_flags = ["--kv-cache-dir", kv_dir, "--kv-offloading-size", "8"]
    # --gpu-memory-utilization counts the whole device's memory, the other
    # engine's included: the second engine gets twice the first's share (and
    # the prefill engine's pool, allocated after its own share, on top).
    pre = Proc(common + ["--role", "prefill"] + pre_flags, "/ready", log)
    procs.append(pre)
    share = 2 * float(a.mem) + (float(a.pool_gib) / 141.0 if transport == "shared" else 0.0)
    second = common[:-1] + [str(min(0.95, share))] if a.device == "cuda" else common
    dec = Proc(second + ["--role", "decode"] + dec_flags, "/ready", log)
    procs.append(dec)
    router = Proc([a.deepinfer, "router", "--backend", pre.url, "--backend", dec.url, "--health-interval", "0.5"],
                  "/health", log)
    procs.append(router)
    try:
        complete(router.url, prompts[0][:256], 1)
        before = dec.metrics()
        fresh = [[rng.randrange(3, vocab) for _ in range(a.prompt)] for _ in range(a.prompts)]
        dis_ttft = [complete(router.url, p, 1) for p in fresh]
        after = dec.metrics()

        def delta(name, **labels):
            return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)
        loaded_tokens = delta("deepinfer:kv_tier_hit_tokens_total")
        # Bytes loaded into the decode engine's pages (from its host tier or a peer pool).
        loaded_bytes = delta("deepinfer:kv_tier_read_bytes_total", tier="host")
        timed_bytes = delta("deepinfer:kv_load_timed_bytes_total")
        timed_s = delta("deepinfer:kv_load_timed_seconds_total")
        onload_s = delta("deepinfer:kv_tier_onload_seconds_total")
        disk_bytes = delta("deepinfer:kv_tier_read_bytes_total", tier="disk")
        bytes_per_prompt = loaded_bytes / max(1, a.prompts)
        extra_s = statistics.median(dis_ttft) - a.colocated_ttft_s
        r.update({
            "disaggregated_ttft_s": statistics.median(dis_ttft),
            "handoff_loaded_tokens_per_prompt": loaded_tokens / a.prompts,
            "handoff_bytes_per_prompt": bytes_per_prompt,
            "handoff_added_s": extra_s,
            "handoff_effective_gbs": bytes_per_prompt / extra_s / 1e9 if extra_s > 0 else None,
            "decode_load_gbs": timed_bytes / timed_s / 1e9 if timed_s > 0 else None,
            "decode_load_timed_bytes": timed_bytes,
            "decode_disk_read_gbs": disk_bytes / onload_s / 1e9 if onload_s > 0 else None,
            "peer_loaded_blocks": delta("deepinfer:kv_peer_loaded_blocks_total"),
            "kv_export": {k: v for k, v in pre.metrics().items() if "kv_export" in k},
        })
        texts = []
        for p in a.check_prompts:
            complete(router.url, p, 8, texts)
        r["outputs_equal_colocated_prefix_hit"] = sum(x == y for x, y in zip(texts, a.check_texts))
        r["outputs_checked"] = len(a.check_texts)
        r["disaggregated_load"] = loaded_run(router.url, vocab, a, random.Random(5))
    finally:
        for p in (router, dec, pre):
            p.stop()
            procs.remove(p)
    return r


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
    ap.add_argument("--transport", default="shared,directory", help="comma-separated: shared, directory")
    ap.add_argument("--pool-gib", default="6", help="--kv-transport-size of the prefill engine (shared)")
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
    check_prompts = [[rng.randrange(3, vocab) for _ in range(a.prompt)] for _ in range(3)]
    a.check_prompts, a.check_texts = check_prompts, []
    procs = []
    try:
        # Colocated: one engine does both.
        colo = Proc(common, "/ready", log)
        procs.append(colo)
        complete(colo.url, prompts[0][:256], 1)  # warm-up
        colo_ttft = [complete(colo.url, p, 1) for p in prompts]
        result["colocated_ttft_s"] = statistics.median(colo_ttft)
        a.colocated_ttft_s = result["colocated_ttft_s"]
        # The outputs a handoff must reproduce: a prompt's second run on the
        # colocated engine loads all its full blocks from the prefix cache and
        # computes the rest, exactly what a decode engine does with KV handed
        # over (same kernels, same bytes), so the tokens must be the same.
        for p in check_prompts:
            complete(colo.url, p, 8)
            complete(colo.url, p, 8, a.check_texts)
        result["colocated_load"] = loaded_run(colo.url, vocab, a, random.Random(5))
        save(a.out, result)
        colo.stop()
        procs.remove(colo)
        for transport in a.transport.split(","):
            result[transport] = disaggregated(a, common, transport, kv_dir, prompts, vocab, rng, procs, log)
            save(a.out, result)
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(kv_dir, ignore_errors=True)
    save(a.out, result)

    def g(x, f="{:.1f}"):
        return "n/a" if x is None else f.format(x)
    transports = [t for t in a.transport.split(",") if t in result]
    lines = [
        f"- prompt {a.prompt} tokens; engines at --gpu-memory-utilization {a.mem}; directory transport on {base}",
        f"- device copy {g(d2d)} GB/s, pinned host-to-device {g(h2d)} GB/s (torch, same GPU)",
        f"- TTFT colocated {result['colocated_ttft_s'] * 1e3:.0f} ms",
    ]
    for t in transports:
        r = result[t]
        lines.append(
            f"- {t}: TTFT {r['disaggregated_ttft_s'] * 1e3:.0f} ms (+{r['handoff_added_s'] * 1e3:.0f} ms for "
            f"{r['handoff_bytes_per_prompt'] / 2**20:.0f} MiB of KV: {g(r['handoff_effective_gbs'], '{:.2f}')} GB/s "
            f"end to end); the decode engine's loads into its pages {g(r['decode_load_gbs'], '{:.1f}')} GB/s "
            f"(device time); {r['handoff_loaded_tokens_per_prompt']:.0f} prompt tokens loaded per request; "
            f"8-token greedy outputs equal to the colocated engine's prefix-hit run: "
            f"{r['outputs_equal_colocated_prefix_hit']}/{r['outputs_checked']}"
            + (f"; disk reads {g(r['decode_disk_read_gbs'], '{:.2f}')} GB/s" if r.get('decode_disk_read_gbs') else ""))
    lines += [
        "",
        f"| {a.streams} streams × {a.gen} tokens, a {a.prompt}-token prompt every {a.interval} s | ITL p50 | ITL p99 | p99.9 | max | mean | long prompts |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = [("colocated", result["colocated_load"])] + [(f"disaggregated ({t})", result[t]["disaggregated_load"])
                                                         for t in transports]
    for name, r in rows:
        lines.append(f"| {name} | {r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms | {r['itl_p999_ms']:.1f} ms | "
                     f"{r['itl_max_ms']:.1f} ms | {r['itl_mean_ms']:.1f} ms | "
                     f"{r['long_prompts']}{' errors: ' + str(r['errors']) if r['errors'] else ''} |")
    with open(os.path.join(a.out, "disagg.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
