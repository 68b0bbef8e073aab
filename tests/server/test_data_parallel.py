"""Data parallelism through the real binary: `--data-parallel-size` ranks as
processes, each an engine on its own share of the requests. With
`--enable-expert-parallel` the ranks' MoE layers (with
`--tensor-parallel-size`, every rank of every data-parallel rank's group) form
one expert-parallel group and vote before every step (ANY or ALL), ranks without work run
one-padding-token steps, and EPLB moves experts between them while they run;
the tokens must be one rank's. `serve` puts rank 0's router in front of the
ranks; a rank that dies ends the group with an error, not a hang."""
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
TINY = ROOT / "tests" / "data" / "hf_tiny"
# Prompts of different lengths, two sharing a prefix (a prefix-cache hit on
# the rank that runs both), and more of them than ranks.
PROMPTS = ("hello world the cat", "one two three four", "a b c", "the quick brown fox jumps over",
           "the quick brown fox sleeps", "x y z", "red green blue yellow", "seven")


def generate_tiny(tmp_path, model, name, *extra, max_tokens=16):
    src = tmp_path / "tiny.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "max_tokens": max_tokens}) + "\n" for p in PROMPTS))
    out = tmp_path / f"tiny_{model}_{name}.jsonl"
    # A small step budget chunks the prompts over several steps.
    args = [str(binary()), "generate", "--model", str(TINY / model), "--tokenizer", str(TINY / "tokenizer.json"),
            "--threads", "1", "--input", str(src), "--output", str(out), "--max-num-batched-tokens", "4", *extra]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "DEEPINFER_DIST_TIMEOUT_S": "30"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(PROMPTS)))
    return [line["token_ids"] for line in lines], run.stderr


def padding_steps(log):
    m = re.search(r"data parallel \(rank 0\): (\d+) group votes, (\d+) padding steps", log)
    assert m, log[-2000:]
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("model,method", [("deepseek_v3_mtp_oracle", "mtp"), ("mixtral", "draft_model")])
def test_speculation_in_an_expert_parallel_group_matches_one_rank(tmp_path, model, method):
    """Two data-parallel ranks sharing their experts, each speculating on its
    own: DeepSeek-V3's MTP layer (the oracle checkpoint, whose MTP layer
    predicts the model's next token) or a draft model (the target's own
    weights), whole on each rank. The greedy tokens of one rank without
    speculation, and drafts accepted."""
    config = {"method": method, "num_speculative_tokens": 2}
    if method == "draft_model":
        config["model"] = str(TINY / model)
    one, _ = generate_tiny(tmp_path, model, "one")
    dp, log = generate_tiny(tmp_path, model, "dp2_spec", "--data-parallel-size", "2", "--enable-expert-parallel",
                            "--speculative-config", json.dumps(config))
    accepted = re.search(r"verified, (\d+) accepted", log)
    assert accepted and int(accepted.group(1)) > 0, log[-2000:]
    assert dp == one


@pytest.mark.parametrize("model,dp,mode", [("mixtral", 2, "any"), ("mixtral", 4, "all"), ("mixtral", 4, "any"),
                                           ("qwen3_moe", 2, "all"), ("deepseek_v3", 2, "any")])
def test_expert_parallel_data_parallel_group_matches_one_rank(tmp_path, model, dp, mode):
    """Experts spread over the data-parallel ranks, each rank with its own
    requests (every dp-th prompt), a vote before every step, EPLB re-placing
    the experts (weights moved between ranks) every 3 steps: one rank's greedy
    tokens. Rank 0's share runs out before the others' on 4 ranks, so it runs
    padding steps for their collectives."""
    one, _ = generate_tiny(tmp_path, model, "one")
    got, log = generate_tiny(tmp_path, model, f"dp{dp}", "--data-parallel-size", str(dp), "--enable-expert-parallel",
                             "--dp-vote-mode", mode, "--eplb-window-steps", "4", "--eplb-interval-steps", "3")
    assert got == one
    assert f"({dp} data-parallel ranks)" in log
    assert f"re-placed over {dp} ranks" in log, log[-2000:]
    votes, padding = padding_steps(log)
    assert votes > 0
    if dp == 4:
        assert padding > 0, log[-2000:]


@pytest.mark.parametrize("model", ["mixtral", "deepseek_v3"])
def test_experts_over_tensor_and_data_parallel_ranks_match_one_rank(tmp_path, model):
    """Two data-parallel ranks, each a tensor-parallel group of two processes,
    the experts spread over all four (EPLB moving them every 3 steps), a
    vote before every step: one rank's greedy tokens. A group without work
    runs padding steps, its follower with it."""
    one, _ = generate_tiny(tmp_path, model, "one")
    got, log = generate_tiny(tmp_path, model, "tp2dp2", "--tensor-parallel-size", "2", "--data-parallel-size", "2",
                             "--enable-expert-parallel", "--eplb-window-steps", "4", "--eplb-interval-steps", "3")
    assert got == one
    assert "experts spread over all 4 ranks" in log, log[-2000:]
    assert "re-placed over 4 ranks" in log, log[-2000:]
    assert padding_steps(log)[0] > 0


def test_dense_data_parallel_matches_one_rank_on_the_default_model(tmp_path):
    """SmolLM2 (Q4_1), two ranks with the whole model each: one rank's tokens,
    and no padding steps (no collectives in the forward). Batch-invariant
    kernels: a rank's batches are not one rank's (half the requests, other
    prefill chunks), and the default kernels pick their rounding by the
    step's size, as they do on one rank under a changing load."""
    src = tmp_path / "in.jsonl"
    questions = ("What is the capital of France?", "Name a primary colour.", "What do bees make?",
                 "How many legs does a spider have?", "Why is the sky blue?")
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}], "max_tokens": 16}) + "\n"
                           for q in questions))
    outs = []
    for dp in (1, 2):
        out = tmp_path / f"out{dp}.jsonl"
        run = subprocess.run([str(binary()), "generate", "--model", str(MODEL), "--threads", "1", "--input", str(src),
                              "--output", str(out), "--max-num-batched-tokens", "16", "--data-parallel-size", str(dp)],
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "DEEPINFER_BATCH_INVARIANT": "1"})
        assert run.returncode == 0, run.stderr[-3000:]
        outs.append([json.loads(line)["token_ids"] for line in out.read_text().splitlines()])
        if dp == 2:
            assert padding_steps(run.stderr)[1] == 0
    assert len(outs[1]) == len(questions) and outs[0] == outs[1]


def test_a_single_prompt_on_a_group_streams_from_rank_0():
    args = [str(binary()), "generate", "--model", str(TINY / "mixtral"), "--tokenizer", str(TINY / "tokenizer.json"),
            "--threads", "1", "--prompt", "hello world", "--max-tokens", "8", "-q"]
    one = subprocess.run(args, capture_output=True, text=True, timeout=300)
    dp = subprocess.run(args + ["--data-parallel-size", "2", "--enable-expert-parallel"], capture_output=True,
                        text=True, timeout=300)
    assert one.returncode == 0 and dp.returncode == 0, dp.stderr[-2000:]
    assert dp.stdout == one.stdout and one.stdout.strip()


def completions(url, prompts):
    texts = []
    for p in prompts:
        r = httpx.post(url + "/v1/completions", timeout=300,
                       json={"model": "smollm2", "prompt": p, "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    return texts


def tiny_server(*extra, env=None, model_dir="mixtral"):
    return Server("--threads", "1", "--tokenizer", str(TINY / "tokenizer.json"), *extra, model=TINY / model_dir,
                  env=env)


def children(pid):
    kids = []
    for t in pathlib.Path(f"/proc/{pid}/task").iterdir():
        kids += [int(c) for c in (t / "children").read_text().split()]
    return kids


def test_serve_routes_over_the_ranks_and_a_killed_rank_stops_the_group():
    one = tiny_server()
    try:
        want = completions(one.url, PROMPTS[:4])
    finally:
        one.stop()
    s = tiny_server("--data-parallel-size", "2", "--enable-expert-parallel", env={"DEEPINFER_DIST_TIMEOUT_S": "10"})
    try:
        assert completions(s.url, PROMPTS[:4]) == want
        backends = httpx.get(s.url + "/router/backends", timeout=10).json()
        assert len(backends["backends"]) == 2, backends
        followers = children(s.proc.pid)
        assert len(followers) == 1
        os.kill(followers[0], signal.SIGKILL)
        assert wait_for(lambda: s.proc.poll() is not None, timeout=20)
        assert s.proc.returncode != 0
        log = s.log_path.read_text()
        assert "rank 1" in log and "stopping" in log, log[-2000:]
    finally:
        s.stop()


def test_launcher_started_ranks_and_a_killed_rank_end_the_other(tmp_path):
    """Two serve processes started as torchrun would start them; killing rank 1
    ends rank 0 with an error within the timeout: the idle group still votes,
    and the vote finds the peer gone."""
    port = free_port()
    args = [str(binary()), "serve", "--model", str(TINY / "mixtral"), "--tokenizer", str(TINY / "tokenizer.json"),
            "--threads", "1", "--port", str(port), "--served-model-name", "smollm2", "--data-parallel-size", "2",
            "--enable-expert-parallel"]
    with launched_ranks(tmp_path, args) as procs:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: answers_ready(url), timeout=120), (tmp_path / "rank0.log").read_text()[-2000:]
        assert all(completions(url, PROMPTS[:2]))
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        start = time.time()
        procs[0].wait(timeout=60)
        assert time.time() - start < 20
        assert procs[0].returncode != 0
        log = (tmp_path / "rank0.log").read_text()
        assert "engine loop died" in log and "gloo" in log, log[-2000:]


@pytest.mark.parametrize("signalled", ["all", "rank1"])
def test_sigterm_stops_an_expert_parallel_group_cleanly(tmp_path, signalled):
    """Two serve ranks started as torchrun starts them, sharing their experts.
    A SIGTERM to every rank (what a launcher or Kubernetes sends), or to
    rank 1 alone: each rank drains, votes that it is leaving, and all leave
    after the same vote with status 0 (rank 0 stops because rank 1 does)."""
    port = free_port()
    args = [str(binary()), "serve", "--model", str(TINY / "mixtral"), "--tokenizer", str(TINY / "tokenizer.json"),
            "--threads", "1", "--port", str(port), "--served-model-name", "smollm2", "--data-parallel-size", "2",
            "--enable-expert-parallel", "--shutdown-timeout", "5"]
    with launched_ranks(tmp_path, args) as procs:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: answers_ready(url), timeout=120), (tmp_path / "rank0.log").read_text()[-2000:]
        assert all(completions(url, PROMPTS[:2]))
        for p in procs if signalled == "all" else procs[1:]:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(2)]
        assert [p.returncode for p in procs] == [0, 0], logs[0][-1500:] + logs[1][-1500:]
        for log in logs:
            assert "serve: stopped" in log and "engine loop died" not in log, log[-2000:]
        if signalled == "rank1":
            assert "another rank of the data-parallel group is stopping" in logs[0], logs[0][-2000:]


def test_dense_replicas_serve_on_when_one_rank_dies(tmp_path):
    """Dense ranks started as torchrun would start them are independent
    replicas behind rank 0's router (no vote): both serve, and when rank 1 is
    killed the router takes it out and rank 0 goes on answering."""
    port = free_port()
    args = [str(binary()), "serve", "--model", str(TINY / "llama"), "--tokenizer", str(TINY / "tokenizer.json"),
            "--threads", "1", "--port", str(port), "--served-model-name", "smollm2", "--data-parallel-size", "2"]
    with launched_ranks(tmp_path, args) as procs:
        url = f"http://127.0.0.1:{port}"

        def both_up():
            try:
                backends = httpx.get(url + "/router/backends", timeout=1).json()["backends"]
                return len(backends) == 2 and all(b["healthy"] for b in backends)
            except (httpx.HTTPError, KeyError, ValueError):
                return False
        assert wait_for(both_up, timeout=120), (tmp_path / "rank0.log").read_text()[-2000:]
        before = completions(url, PROMPTS[:4])
        log0 = (tmp_path / "rank0.log").read_text()
        assert "the ranks step independently" in log0, log0[-2000:]
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        time.sleep(1)
        assert completions(url, PROMPTS[:4]) == before
        assert procs[0].poll() is None


@pytest.mark.parametrize("model", ["llama", "qwen3_moe"])
def test_data_parallel_ranks_of_tensor_parallel_groups_match_one_rank(tmp_path, model):
    """--data-parallel-size 2 x --tensor-parallel-size 2: four processes, two
    engines each split over two ranks: one rank's greedy tokens."""
    one, _ = generate_tiny(tmp_path, model, "one")
    got, log = generate_tiny(tmp_path, model, "dp2tp2", "--data-parallel-size", "2", "--tensor-parallel-size", "2")
    assert got == one
    assert "tensor-parallel rank 1 of 2 of data-parallel rank 1" in log, log[-2000:]


def test_serve_data_parallel_ranks_of_tensor_parallel_groups():
    one = tiny_server(model_dir="llama")
    try:
        want = completions(one.url, PROMPTS[:3])
    finally:
        one.stop()
    s = tiny_server("--data-parallel-size", "2", "--tensor-parallel-size", "2", model_dir="llama",
                    env={"DEEPINFER_DIST_TIMEOUT_S": "10"})
    try:
        assert completions(s.url, PROMPTS[:3]) == want
    finally:
        s.stop()


def test_the_router_in_front_of_the_ranks_requires_the_api_key():
    s = tiny_server("--data-parallel-size", "2", "--api-key", "sesame", model_dir="llama",
                    env={"DEEPINFER_DIST_TIMEOUT_S": "10"})
    try:
        body = {"model": "smollm2", "prompt": "a b c", "max_tokens": 2, "temperature": 0}
        assert httpx.post(s.url + "/v1/completions", json=body, timeout=60).status_code == 401
        ok = httpx.post(s.url + "/v1/completions", json=body, timeout=60,
                        headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200, ok.text
        backend = httpx.get(s.url + "/router/backends", timeout=10,
                            headers={"Authorization": "Bearer sesame"}).json()["backends"][0]["url"]
        # The admin endpoints too: nobody without the key takes a rank out.
        assert httpx.post(s.url + "/router/drain", json={"url": backend}, timeout=10).status_code == 401
    finally:
        s.stop()


def test_a_group_registers_its_router_in_etcd():
    """serve --data-parallel-size 2 --etcd: rank 0 registers the group's
    router (the public port) once it listens and the other rank nothing, so a
    `router --etcd` in front sends to the group as to one engine; a clean stop
    takes the record away."""
    from test_router import Etcd, Router
    etcd = Etcd()
    router = s = None
    try:
        router = Router([], "--etcd", etcd.url, "--health-interval", "0.2", need_backend=False)
        s = tiny_server("--data-parallel-size", "2", "--etcd", etcd.url, model_dir="llama",
                        env={"DEEPINFER_DIST_TIMEOUT_S": "10"})
        assert wait_for(lambda: [b["url"] for b in router.backends() if b["healthy"]] == [s.url], timeout=20), \
            router.backends()
        assert completions(router.url, PROMPTS[:2]) == completions(s.url, PROMPTS[:2])
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=60)
        assert wait_for(lambda: router.backends() == [], timeout=15), router.backends()
    finally:
        if router:
            router.stop()
        if s:
            s.stop()
        etcd.stop()
