#!/usr/bin/env python3
"""KV tiers on the GPU (docs/benchmarks.md, "KV tiers"): time to first token
of a repeated long context served from the host tier and from the disk tier
against recomputing it, and throughput at a 0% hit rate with the tiers on
against off. Random weights of the Llama-3-8B shape (scripts/gpu_e2e.py).

  1. Recompute: `deepinfer serve` without prefix caching; a C-token context
     plus a 16-token question, max_tokens 1; the request's latency is its
     time to first token (prefill + one sampled token).
  2. Host tier: --kv-offloading-size with a device cache that holds one
     context: A, then B (evicts A from the device), then A again (host hit).
  3. Disk tier: a new server on the same --kv-cache-dir (the host tier is
     empty): A again, with the files dropped from the page cache first
     (posix_fadvise DONTNEED: a cold read), then after a restart with them
     cached by the previous read (warm).
  4. Throughput: `deepinfer generate`, N random prompts (no shared prefix)
     of P tokens, G output tokens: tiers off, host tier, host + disk tier.

Usage: scripts/gpu_kv_tiers.py --deepinfer BIN --model DIR --out DIR [--ctx 32768]
Writes kv_tiers.json and kv_tiers.md into --out.
"""
import argparse
import glob
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, exe, model, extra, log_path, device="cuda"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "a")
        self.log.write(f"\n=== serve {' '.join(extra)}\n")
        self.log.flush()
        cmd = [exe, "serve", "--device", device, "--model", model, "--port", str(self.port),
               "--max-body-bytes", str(64 << 20), "--served-model-name", "m"] + extra
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 400
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("server not ready in 400 s")

    def complete(self, ids, max_tokens=1):
        body = json.dumps({"model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"request failed: {e.code} {e.read()[:500]!r}") from None
        latency = time.perf_counter() - t0
        return latency, out["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def stop(self):
        # SIGTERM: a clean exit finishes the queued disk writes.
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def drop_page_cache(cache_dir):
    n = 0
    for f in glob.glob(os.path.join(cache_dir, "*", "*.kvb")):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        n += 1
    return n


def tier_metrics(m):
    keep = ("kv_tier_hit_tokens_total", "kv_tier_hits_total", "kv_tier_read_bytes_total", "kv_tier_onload",
            "kv_tier_stored_blocks_total", "kv_tier_written_bytes_total", "kv_tier_write_errors")
    return {k: v for k, v in m.items() if any(x in k for x in keep)}


def generate_throughput(exe, model, workdir, n, p, g, vocab, extra, log_path, device="cuda"):
    rng = random.Random(7)
    path = os.path.join(workdir, "tput.jsonl")
    with open(path, "w") as f:
        for _ in range(n):
            ids = [rng.randrange(3, vocab) for _ in range(p)]
            f.write(json.dumps({"prompt_token_ids": ids, "max_tokens": g, "ignore_eos": True, "temperature": 0}) + "\n")
    cmd = [exe, "generate", "--device", device, "--model", model, "--input", path, "--output",
           os.path.join(workdir, "tput_out.jsonl"), "--max-num-seqs", str(n), "--max-model-len", str(p + g + 16)] + extra
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    with open(log_path, "a") as log:
        log.write(f"\n=== generate {' '.join(extra)} (exit {r.returncode}, {time.time() - t0:.1f} s)\n{r.stderr[-6000:]}\n")
    if r.returncode != 0:
        raise RuntimeError(f"generate failed: {r.stderr[-2000:]}")
    m = re.search(r"([0-9.]+) generated tok/s, ([0-9.]+) total tok/s", r.stderr)
    tiers = re.search(r"^kv tiers: .*$", r.stderr, re.M)
    return {"generated_tok_s": float(m.group(1)), "total_tok_s": float(m.group(2)),
            "tiers": tiers.group(0) if tiers else ""}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="/tmp/deepinfer_kv_tiers")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--host-gib", type=float, default=24.0)
    ap.add_argument("--tput", default="256,1024,256", help="requests,prompt,output for the throughput runs")
    ap.add_argument("--skip", default="", help="comma list of phases to skip: ttft,tput")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (a GGUF --model needs --vocab)")
    ap.add_argument("--vocab", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    log_path = os.path.join(args.out, "kv_tiers.log")
    kv_bytes_per_token = 0
    vocab = args.vocab
    if not vocab:
        with open(os.path.join(args.model, "config.json")) as f:
            cfg = json.load(f)
        vocab = cfg["vocab_size"]
        L, hkv = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
        d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_bytes_per_token = L * 2 * hkv * d * 2
    rng = random.Random(1)
    doc_a = [rng.randrange(3, vocab) for _ in range(args.ctx)]
    doc_b = [rng.randrange(3, vocab) for _ in range(args.ctx)]
    warm_up = [rng.randrange(3, vocab) for _ in range(2048)]  # shares nothing with A or B
    question = lambda i: [rng.randrange(3, vocab) for _ in range(16)]  # noqa: E731
    res = {"ctx": args.ctx, "kv_bytes_per_token": kv_bytes_per_token,
           "context_kv_gib": args.ctx * kv_bytes_per_token / 2**30}
    out_json = os.path.join(args.out, "kv_tiers.json")

    def save():
        with open(out_json, "w") as f:
            json.dump(res, f, indent=2)

    cache_dir = os.path.join(args.workdir, "kvcache")
    subprocess.run(["rm", "-rf", cache_dir])
    max_len = str(args.ctx + 64)
    common = ["--max-model-len", max_len, "--max-num-seqs", "8"]
    skip = set(args.skip.split(","))
    if "ttft" not in skip:
        # 1. Recompute.
        s = Server(args.deepinfer, args.model, common + ["--no-enable-prefix-caching"], log_path, args.device)
        try:
            s.complete(warm_up)
            res["recompute_ttft_s"] = [s.complete(doc_a + question(i))[0] for i in range(3)]
        finally:
            s.stop()
        save()
        # 2. Host tier (and the files of the disk tier written as they go).
        device_tokens = str(args.ctx + 4096)  # one context fits, two do not
        tiers = ["--kv-offloading-size", str(args.host_gib), "--kv-cache-dir", cache_dir, "--kv-cache-dir-size", "24"]
        s = Server(args.deepinfer, args.model, common + ["--kv-cache-tokens", device_tokens] + tiers, log_path,
                       args.device)
        try:
            s.complete(warm_up)
            first_a = s.complete(doc_a + question(1))
            first_b = s.complete(doc_b + question(1))
            host = [s.complete(doc_a + question(2)), s.complete(doc_b + question(2)), s.complete(doc_a + question(3))]
            res["first_pass_with_offload_ttft_s"] = [first_a[0], first_b[0]]
            res["host_hit_ttft_s"] = [h[0] for h in host]
            res["host_hit_cached_tokens"] = [h[1] for h in host]
            res["host_metrics"] = tier_metrics(s.metrics())
        finally:
            s.stop()
        res["disk_files"] = len(glob.glob(os.path.join(cache_dir, "*", "*.kvb")))
        save()
        # 3. Disk tier, cold then warm page cache.
        for label in ("cold", "warm"):
            dropped = drop_page_cache(cache_dir) if label == "cold" else 0
            if label == "warm":  # the files read once, so the page cache holds them
                for f in glob.glob(os.path.join(cache_dir, "*", "*.kvb")):
                    with open(f, "rb") as fh:
                        while fh.read(1 << 22):
                            pass
            s = Server(args.deepinfer, args.model, common + ["--kv-cache-tokens", device_tokens] + tiers, log_path,
                       args.device)
            try:
                hit = s.complete(doc_a + question(4 if label == "cold" else 5))
                res[f"disk_{label}_ttft_s"] = hit[0]
                res[f"disk_{label}_cached_tokens"] = hit[1]
                res[f"disk_{label}_files_dropped"] = dropped
                res[f"disk_{label}_metrics"] = tier_metrics(s.metrics())
            finally:
                s.stop()
            save()
        subprocess.run(["rm", "-rf", cache_dir])
    if "multiturn" not in skip:
        # Conversations over one shared document on a device cache that cannot
        # hold them all: the host tier against none.
        mt = ["bench", "multiturn", "--device", args.device, "--model", args.model, "--conversations", "32",
              "--turns", "3", "--doc-len", "8192", "--question-len", "256", "--output-len", "128",
              "--kv-cache-tokens", "131072", "--max-model-len", "9600"]
        for label, extra in (("off", []), ("host", ["--kv-offloading-size", "24"])):
            r = subprocess.run([args.deepinfer] + mt + extra, capture_output=True, text=True, timeout=300)
            with open(log_path, "a") as log:
                log.write(f"\n=== multiturn {label} (exit {r.returncode})\n{r.stdout}\n{r.stderr[-3000:]}\n")
            res[f"multiturn_{label}"] = r.stdout
            save()
    if "tput" not in skip:
        n, p, g = (int(x) for x in args.tput.split(","))
        res["tput_shape"] = {"requests": n, "prompt": p, "output": g}
        runs = {"off": [], "host": ["--kv-offloading-size", "16"],
                "host+disk": ["--kv-offloading-size", "16", "--kv-cache-dir", cache_dir, "--kv-cache-dir-size", "16"]}
        for label, extra in runs.items():
            subprocess.run(["rm", "-rf", cache_dir])
            res[f"tput_{label}"] = generate_throughput(args.deepinfer, args.model, args.workdir, n, p, g, vocab,
                                                       extra + ["--max-num-batched-tokens", "8192"], log_path,
                                                       args.device)
            save()
        subprocess.run(["rm", "-rf", cache_dir])

    # Summary.
    lines = [f"# KV tiers, {args.ctx}-token context ({res['context_kv_gib']:.2f} GiB of KV)", ""]
    if "recompute_ttft_s" in res:
        rec = statistics.median(res["recompute_ttft_s"])
        host = statistics.median(res["host_hit_ttft_s"])
        lines += [f"- recompute TTFT: {rec:.3f} s (median of {res['recompute_ttft_s']})",
                  f"- first pass with offload on: {res['first_pass_with_offload_ttft_s']}",
                  f"- host-tier hit TTFT: {host:.3f} s ({100 * (1 - host / rec):.1f}% cut; cached tokens "
                  f"{res['host_hit_cached_tokens']})"]
        for label in ("cold", "warm"):
            if f"disk_{label}_ttft_s" in res:
                t = res[f"disk_{label}_ttft_s"]
                lines.append(f"- disk-tier hit TTFT ({label} page cache): {t:.3f} s ({100 * (1 - t / rec):.1f}% cut; "
                             f"cached tokens {res[f'disk_{label}_cached_tokens']})")
    for label in ("off", "host", "host+disk"):
        if f"tput_{label}" in res:
            t = res[f"tput_{label}"]
            base = res["tput_off"]["generated_tok_s"]
            lines.append(f"- throughput, tiers {label}: {t['generated_tok_s']:.0f} generated tok/s "
                         f"({100 * (t['generated_tok_s'] / base - 1):+.1f}% vs off); {t['tiers']}")
    for label in ("off", "host"):
        if f"multiturn_{label}" in res:
            lines += ["", f"multiturn, tiers {label}:", "```", res[f"multiturn_{label}"].rstrip(), "```"]
    with open(os.path.join(args.out, "kv_tiers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
