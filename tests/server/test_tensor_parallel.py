"""Tensor parallelism through the real binary: `--tensor-parallel-size` ranks
as processes (started by the CLI, or by a launcher's variables as torchrun
sets them) give the tokens of one rank, and a rank that dies takes the group
down with a clear error instead of leaving it hanging."""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import httpx
import pytest

from conftest import ROOT, Server, answers_ready, binary, free_port, launched_ranks, wait_for

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="model not fetched: run ./build.sh")

SYSTEM = "You are a careful assistant. Answer in one short sentence."
QUESTIONS = ("What is the capital of France?", "Name a primary colour.", "What do bees make?",
             "How many legs does a spider have?")


def generate_batch(tmp_path, tp, *extra):
    src = tmp_path / "in.jsonl"
    # The shared system prompt hits the prefix cache.
    src.write_text("".join(json.dumps({"messages": [{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": q}], "max_tokens": 24,
                                       "logprobs": 2}) + "\n"
                           for q in QUESTIONS))
    out = tmp_path / f"out_tp{tp}.jsonl"
    # A small step budget chunks the prompts.
    args = [str(binary()), "generate", "--model", str(MODEL), "--threads", "1", "--input", str(src),
            "--output", str(out), "--max-num-batched-tokens", "16", "--tensor-parallel-size", str(tp), *extra]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


NEAR_TIE = 0.5


def expect_same_greedy(one, tp):
    """Token for token the same, except that a near tie of one rank's may go
    the other way: the decode kernels round activations to 8 bits per block,
    so the last bit of a sum (which the ranks add in another order) can move a
    logit by tenths (test_tensor_parallel.cpp measures it). After the first
    difference the sequences see different inputs and are not compared."""
    assert len(one) == len(tp) == len(QUESTIONS)
    full = 0
    for a, b in zip(one, tp):
        assert a["token_ids"], a
        for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])):
            if x != y:
                top = sorted((t["logprob"] for t in a["logprobs"][i]["top_logprobs"]), reverse=True)
                assert top[0] - top[1] < NEAR_TIE, (i, a["text"], b["text"], top)
                break
        else:
            assert a["token_ids"] == b["token_ids"]
            full += 1
    return full


@pytest.mark.parametrize("tp", [2, 4])
def test_generate_on_several_ranks_matches_one_rank(tmp_path, tp):
    one = generate_batch(tmp_path, 1)
    assert expect_same_greedy(one, generate_batch(tmp_path, tp)) >= len(QUESTIONS) // 2


def test_ngram_speculation_on_two_ranks_matches_one_rank(tmp_path):
    spec = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    assert expect_same_greedy(generate_batch(tmp_path, 1), generate_batch(tmp_path, 2, *spec)) >= len(QUESTIONS) // 2


def test_draft_model_speculation_on_two_ranks_matches_one_rank(tmp_path):
    """The target split over two ranks, the draft model (here the target's own
    weights) whole on rank 0, which alone proposes: the greedy tokens of one
    rank without speculation, and drafts accepted."""
    spec = ["--speculative-config",
            json.dumps({"method": "draft_model", "model": str(MODEL), "num_speculative_tokens": 3})]
    got = generate_batch(tmp_path, 2, *spec)
    assert expect_same_greedy(generate_batch(tmp_path, 1), got) >= len(QUESTIONS) // 2
    assert sum(o["accepted_draft_tokens"] for o in got) > 0


def test_mtp_speculation_on_two_ranks_matches_one_rank(tmp_path):
    """Tiny DeepSeek-V3 whose MTP layer predicts the model's next token (the
    oracle checkpoint, f32): attention heads and experts split over two ranks,
    the MTP layer whole on rank 0 reading the target's hidden states there;
    the greedy tokens of one rank without speculation, and drafts accepted."""
    spec = ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 2})]
    one, _ = generate_tiny(tmp_path, "mtp_one", model="deepseek_v3_mtp_oracle")
    tp, log = generate_tiny(tmp_path, "mtp_tp2", "--tensor-parallel-size", "2", *spec, model="deepseek_v3_mtp_oracle")
    assert "speculative: MTP layer" in log, log[-2000:]
    accepted = re.search(r"verified, (\d+) accepted", log)
    assert accepted and int(accepted.group(1)) > 0, log[-2000:]
    assert tp == one


SECTION = "Section {i}: the {w} fox number {i} jumps over the lazy dog near the river bank."


def document(word):
    return " ".join(SECTION.format(i=i, w=word) for i in range(40))


def test_host_kv_tier_on_two_ranks_serves_an_evicted_prefix(tmp_path):
    """Two ranks with --kv-offloading-size: a ~900-token document is pushed
    out of a 1,600-token device cache by two others and comes back from host
    memory, each rank loading its own heads' slice (rank 0 decides the copies,
    the follower repeats them). The batch-invariant kernels make a loaded
    prefix and a recomputed one agree to the bit, so every token and logprob
    must equal the same run without the host tier."""
    src = tmp_path / "docs.jsonl"
    prompts = [document(w) + " Summarise." for w in ("brown", "red", "grey")]
    prompts.append(document("brown") + " Which colour is the fox?")
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}], "max_tokens": 8,
                                       "logprobs": 1}) + "\n" for p in prompts))
    runs = {}
    for offloading in ("0.25", "0"):
        out = tmp_path / f"out_{offloading}.jsonl"
        run = subprocess.run([str(binary()), "generate", "--model", str(MODEL), "--threads", "1", "--input", str(src),
                              "--output", str(out), "--tensor-parallel-size", "2", "--kv-cache-tokens", "1600",
                              "--max-num-seqs", "1", "--kv-offloading-size", offloading],
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "DEEPINFER_BATCH_INVARIANT": "1"})
        assert run.returncode == 0, run.stderr[-3000:]
        runs[offloading] = ([json.loads(line) for line in out.read_text().splitlines()], run.stderr)
    tiered, log = runs["0.25"]
    loaded = re.search(r"kv tiers: (\d+) prompt tokens loaded instead of computed", log)
    assert loaded and int(loaded.group(1)) >= 16 * 50, log[-2000:]
    assert "this rank's slice of the host tier" in log, log[-2000:]
    plain = runs["0"][0]
    assert [r["token_ids"] for r in tiered] == [r["token_ids"] for r in plain]
    assert [[p["logprob"] for p in r["logprobs"]] for r in tiered] == [[p["logprob"] for p in r["logprobs"]]
                                                                      for r in plain]
    assert tiered[3]["cached_prompt_tokens"] >= 16 * 50


def test_the_disk_tier_on_two_ranks_is_refused_clearly(tmp_path):
    run = subprocess.run([str(binary()), "generate", "--model", str(MODEL), "--threads", "1", "--prompt", "hi",
                          "--max-tokens", "2", "--tensor-parallel-size", "2", "--kv-cache-dir", str(tmp_path / "kv")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "--kv-cache-dir" in run.stderr and "--kv-offloading-size (host memory) does" in run.stderr, run.stderr[-2000:]


def chat(server, content):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "model": "smollm2", "messages": [{"role": "user", "content": content}],
        "max_tokens": 20, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def children(pid):
    tasks = pathlib.Path(f"/proc/{pid}/task")
    kids = []
    for t in tasks.iterdir():
        kids += [int(c) for c in (t / "children").read_text().split()]
    return kids


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


def test_server_on_two_ranks_and_a_killed_follower_stops_it():
    one = Server("--threads", "1")
    try:
        want = chat(one, "Say hello to the tensor-parallel group.")
    finally:
        one.stop()
    s = Server("--threads", "1", "--tensor-parallel-size", "2", env={"DEEPINFER_DIST_TIMEOUT_S": "20"})
    try:
        assert chat(s, "Say hello to the tensor-parallel group.") == want
        followers = children(s.proc.pid)
        assert len(followers) == 1
        os.kill(followers[0], signal.SIGKILL)
        # Rank 0 notices at once (it watches its followers), idle or not.
        assert wait_for(lambda: s.proc.poll() is not None, timeout=20)
        assert s.proc.returncode != 0
        log = s.log_path.read_text()
        assert "rank 1" in log and "stopping" in log, log[-2000:]
    finally:
        s.stop()


@pytest.mark.parametrize("killed", [0, 1])
def test_launcher_variables_and_a_killed_rank_end_the_other(tmp_path, killed):
    """Two processes started as torchrun would start them (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT): rank 0 serves, rank 1 follows. Killing either
    ends the other with an error, not a hang: a follower sees rank 0's
    connections close; an idle rank 0 finds the follower gone at its next
    heartbeat (a quarter of the 20 s timeout)."""
    port = free_port()
    args = [str(binary()), "serve", "--model", str(MODEL), "--threads", "1", "--port", str(port),
            "--served-model-name", "smollm2", "--tensor-parallel-size", "2"]
    with launched_ranks(tmp_path, args, timeout_s=20) as procs:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: answers_ready(url), timeout=120), (tmp_path / "rank0.log").read_text()[-2000:]
        r = httpx.post(url + "/v1/completions", timeout=300,
                       json={"model": "smollm2", "prompt": "One, two, three,", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        other = 1 - killed
        procs[killed].send_signal(signal.SIGKILL)
        procs[killed].wait()
        start = time.time()
        procs[other].wait(timeout=60)
        assert time.time() - start < 30
        assert procs[other].returncode != 0
        log = (tmp_path / f"rank{other}.log").read_text()
        want = "rank 1" if other == 1 else "a rank is gone"
        assert "tensor parallel" in log and want in log, log[-2000:]


TINY = ROOT / "tests" / "data" / "hf_tiny"


def generate_tiny(tmp_path, name, *extra, model="mixtral"):
    src = tmp_path / "tiny.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "max_tokens": 24}) + "\n"
                           for p in ("hello world the cat", "one two three four", "a b c")))
    out = tmp_path / f"tiny_{name}.jsonl"
    args = [str(binary()), "generate", "--model", str(TINY / model), "--tokenizer", str(TINY / "tokenizer.json"),
            "--threads", "1", "--input", str(src), "--output", str(out), *extra]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()], run.stderr


def test_expert_parallel_with_live_replacement_matches_one_rank(tmp_path):
    """Tiny Mixtral (f32) with its experts spread whole over 2 ranks, EPLB
    re-placing them (weights moved between the ranks) every 3 steps: the same
    greedy tokens as one rank."""
    one, _ = generate_tiny(tmp_path, "one")
    ep, log = generate_tiny(tmp_path, "ep", "--tensor-parallel-size", "2", "--enable-expert-parallel",
                            "--eplb-window-steps", "4", "--eplb-interval-steps", "3", "--eplb-redundant-slots", "1")
    assert log.count("experts of 2 MoE layers re-placed over 2 ranks") >= 3, log[-2000:]
    assert ep == one
