"""The persistent KV tier end to end, through `deepinfer generate` processes.

A long prompt served with --kv-cache-dir leaves block files; a new process
with the same directory loads them (cached_prompt_tokens > 0) and generates
the same greedy tokens as a run without any cache. Damaged, truncated,
deleted or half-written files, an unusable directory and a full disk never
crash a run nor change its tokens; they cost hits and are logged.

Every run is batch-invariant (DEEPINFER_BATCH_INVARIANT=1): without it a
prefix hit computes the prompt's tail in a step of another shape than a cold
run, and a near-tie can pick another token; the mode is what makes "the same
tokens" an exact check.
"""
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

SECTION = "Section {i}: the quick brown fox number {i} jumps over the lazy dog near the river bank."
DOC = " ".join(SECTION.format(i=i) for i in range(40))
MAX_TOKENS = 12


def env():
    e = dict(os.environ)
    e["DEEPINFER_BATCH_INVARIANT"] = "1"
    return e


def write_input(path: Path, questions):
    with open(path, "w") as f:
        for q in questions:
            f.write(json.dumps({"prompt": DOC + " " + q, "max_tokens": MAX_TOKENS, "temperature": 0}) + "\n")


def generate(cli, tmp: Path, name: str, cache_dir=None, extra=(), preexec=None, input_name="in.jsonl"):
    out = tmp / f"{name}.jsonl"
    cmd = [cli, "generate", "--threads", "2", "--input", str(tmp / input_name), "--output", str(out)]
    if cache_dir is not None:
        cmd += ["--kv-cache-dir", str(cache_dir)]
    cmd += list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600, preexec_fn=preexec)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rows.sort(key=lambda r: r["index"])
    tokens = [r["token_ids"] for r in rows]
    cached = [r["cached_prompt_tokens"] for r in rows]
    return tokens, cached, p.stderr


def block_files(cache_dir: Path):
    return sorted(cache_dir.glob("*/*.kvb"))


@pytest.fixture()
def reference(cli, tmp_path):
    write_input(tmp_path / "in.jsonl", ["Summarise the sections."])
    tokens, cached, _ = generate(cli, tmp_path, "reference")
    assert cached == [0]
    return tokens


def test_a_new_process_loads_the_prefix_from_disk(cli, tmp_path, reference):
    cache = tmp_path / "cache"
    tokens, cached, log = generate(cli, tmp_path, "first", cache)
    assert tokens == reference and cached == [0]
    assert "kv tiers:" in log
    files = block_files(cache)
    assert len(files) >= 40, f"only {len(files)} block files written"

    tokens, cached, log = generate(cli, tmp_path, "second", cache)
    assert tokens == reference
    # Every full block but the one holding the last prompt token.
    assert cached[0] >= 16 * (len(files) - 4), (cached, len(files))
    assert "disk: " in log and " blocks read in 1 prefetches" in log, log[-2000:]

    # A different prompt sharing the document hits the same blocks.
    write_input(tmp_path / "other.jsonl", ["List the animals."])
    _, cached_other, _ = generate(cli, tmp_path, "other", cache, input_name="other.jsonl")
    assert cached_other[0] >= 16 * 50


def test_damaged_files_are_misses_and_replaced(cli, tmp_path, reference):
    cache = tmp_path / "cache"
    generate(cli, tmp_path, "fill", cache)
    files = block_files(cache)
    assert len(files) >= 40
    # A third corrupted (one byte the checksum alone sees), a third
    # truncated, a third deleted.
    for i, f in enumerate(files):
        data = bytearray(f.read_bytes())
        if i % 3 == 0:
            data[-1] ^= 0x01
            f.write_bytes(bytes(data))
        elif i % 3 == 1:
            f.write_bytes(bytes(data[: len(data) // 3]))
        else:
            f.unlink()
    tokens, cached, log = generate(cli, tmp_path, "damaged", cache)
    assert tokens == reference
    assert cached[0] < 16 * len(files)
    assert "removed a damaged block file" in log, log[-3000:]
    # The run checked the files its broken chain left unread and rewrote the
    # damaged ones: the next run hits the whole prefix, and reads nothing bad.
    tokens, cached, log = generate(cli, tmp_path, "healed", cache)
    assert tokens == reference
    assert cached[0] >= 16 * (len(files) - 4)
    assert "removed a damaged block file" not in log and " 0 rejected as damaged" in log


def test_a_process_killed_mid_write_leaves_no_wrong_kv(cli, tmp_path, reference):
    cache = tmp_path / "cache"
    # Many copies of the long prompt with distinct endings: a run long enough to kill while writing.
    write_input(tmp_path / "many.jsonl", [f"Question {i}: which section mentions number {i}?" for i in range(24)])
    cmd = [cli, "generate", "--threads", "2", "--input", str(tmp_path / "many.jsonl"), "--output",
           str(tmp_path / "killed.jsonl"), "--kv-cache-dir", str(cache)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    deadline = time.time() + 120
    while time.time() < deadline and not block_files(cache):
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert block_files(cache), "the run wrote no block before it was killed"
    # And what a torn write looks like had the kill landed inside one.
    folder = next(cache.iterdir())
    (folder / ".tmp-999-0").write_bytes(b"DIKVBLK1 half a block")
    victim = block_files(cache)[0]
    victim.write_bytes(victim.read_bytes()[:100])

    tokens, _, log = generate(cli, tmp_path, "after-kill", cache)
    assert tokens == reference
    assert not list(folder.glob(".tmp-*")), "leftover temporary files are removed at start-up"


def test_an_unusable_directory_degrades_to_no_disk_tier(cli, tmp_path, reference):
    # A path under a regular file cannot be a directory.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    tokens, cached, log = generate(cli, tmp_path, "enotdir", blocker / "cache")
    assert tokens == reference and cached == [0]
    assert "kv disk tier" in log and "ERROR" in log, log[-2000:]

    # A read-only directory: permissions for ordinary users; root ignores
    # them, so there a read-only file system (sysfs) stands in.
    if os.geteuid() == 0:
        readonly = Path("/sys/kernel")
    else:
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        readonly.chmod(0o555)
    tokens, cached, log = generate(cli, tmp_path, "readonly", readonly)
    assert tokens == reference and cached == [0]
    assert "ERROR" in log


def _small_file_limit():
    # Block files exceed 64 KiB; the run's own small outputs do not. SIGXFSZ
    # would kill the process: ignored, a write past the limit fails with EFBIG.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def test_a_full_disk_costs_hits_not_tokens(cli, tmp_path, reference):
    cache = tmp_path / "cache"
    tokens, cached, log = generate(cli, tmp_path, "full", cache, preexec=_small_file_limit)
    assert tokens == reference and cached == [0]
    assert "write errors" in log
    assert not block_files(cache)
    assert not list(cache.glob("*/.tmp-*")), "failed writes leave no temporary file"
    # The next run, with room, has nothing to load but works.
    tokens, cached, _ = generate(cli, tmp_path, "room", cache)
    assert tokens == reference and cached == [0]


def test_cache_ttl_is_validated(cli, tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "hi", "cache_ttl": -5}) + "\n")
    p = subprocess.run([cli, "generate", "--input", str(tmp_path / "bad.jsonl")], capture_output=True, text=True,
                       env=env(), timeout=120)
    assert p.returncode != 0
    assert "cache_ttl" in p.stderr


GEMMA = Path(__file__).resolve().parents[2] / "models" / "gemma-3-270m-q4_k_m.gguf"


@pytest.mark.skipif(not GEMMA.exists(), reason="models/gemma-3-270m-q4_k_m.gguf is fetched by ./build.sh")
def test_sliding_window_layers_are_replayed_from_the_disk_tier(cli, tmp_path):
    # Gemma 3 270M: 15 of 18 layers see a 512-token window. Only the 3
    # full-attention layers' blocks go to the tier; a hit rebuilds the
    # windowed layers from the last W + r = 518 tokens before its end.
    write_input(tmp_path / "in.jsonl", ["Which section mentions number 7?"])
    cache = tmp_path / "cache"
    extra = ["--model", str(GEMMA)]
    tokens, cached, _ = generate(cli, tmp_path, "cold", cache, extra)
    assert cached == [0]
    prompt_len = json.loads((tmp_path / "cold.jsonl").read_text().splitlines()[0])["prompt_tokens"]
    assert prompt_len > 800
    files = block_files(cache)
    # One group's blocks (the full-attention layers'), not six groups'.
    assert len(files) == (prompt_len + MAX_TOKENS - 1) // 16, (len(files), prompt_len)

    replayed, cached, log = generate(cli, tmp_path, "hit", cache, extra)
    full_blocks = (prompt_len - 1) // 16
    expected = (full_blocks * 16 - 518) // 16 * 16
    assert cached == [expected], (cached, expected)
    assert f"kv tiers: {expected} prompt tokens loaded" in log
    assert len(replayed[0]) == MAX_TOKENS
    # The replayed sequence caches nothing new: no file was added.
    assert len(block_files(cache)) == len(files)
