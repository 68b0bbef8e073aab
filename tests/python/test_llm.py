import json
import re
import subprocess
import threading
import time

import pytest

import deepinfer
from deepinfer import LLM, ParamError, SamplingParams, StructuredOutputsParams

GREEDY = SamplingParams(temperature=0, max_tokens=24)


def cli_generate(cli, tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(l) + "\n" for l in lines))
    done = subprocess.run([cli, "generate", "--input", str(src), "-q", "--max-model-len", "2048"],
                          capture_output=True, text=True, check=True)
    return [json.loads(l) for l in done.stdout.splitlines()]


def test_generate_matches_the_cli(llm, cli, tmp_path):
    prompts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
    outs = llm.generate(prompts, GREEDY)
    assert [o.prompt for o in outs] == prompts  # in input order
    ref = cli_generate(cli, tmp_path, [{"prompt": p, "temperature": 0, "max_tokens": 24} for p in prompts])
    for o, r in zip(outs, ref):
        assert o.finished
        assert len(o.outputs) == 1
        c = o.outputs[0]
        assert c.text == r["text"]
        assert c.token_ids == r["token_ids"]
        assert c.finish_reason == r["finish_reason"]
        assert len(o.prompt_token_ids) == r["prompt_tokens"]
        assert o.metrics.latency > 0 and o.metrics.time_to_first_token > 0
    assert outs[0].outputs[0].text.strip() != ""
    assert len({o.request_id for o in outs}) == 3


def test_token_prompts_and_tokenizer(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello world", add_special_tokens=False)
    assert tok.decode(ids) == "Hello world"
    a = llm.generate({"prompt_token_ids": ids}, GREEDY)[0]
    b = llm.generate("Hello world", GREEDY)[0]
    assert a.prompt_token_ids == ids
    assert a.prompt is None
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_chat_matches_the_cli(llm, cli, tmp_path, monkeypatch):
    conv = [{"role": "user", "content": "What is 2 + 2?"}]
    out = llm.chat(conv, GREEDY)[0]
    ref = cli_generate(cli, tmp_path, [{"messages": conv, "temperature": 0, "max_tokens": 24}])[0]
    assert out.outputs[0].text == ref["text"]
    rendered = llm.get_tokenizer().apply_chat_template(conv)
    assert "What is 2 + 2?" in rendered
    # Several conversations at once, each answered in order. The comparison
    # runs on a batch-invariant engine: otherwise a batch of two (and the
    # prefix-cache hit the repeated conversation gets) computes with other
    # kernel shapes, and on some CPUs (AVX-512 here) that flips a near-tie.
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    invariant = LLM(max_model_len=2048, threads=2)
    alone = invariant.chat(conv, GREEDY)[0]
    two = invariant.chat([conv, [{"role": "user", "content": "Name a colour."}]], GREEDY)
    assert len(two) == 2 and two[0].outputs[0].text == alone.outputs[0].text
    assert two[1].outputs[0].text != two[0].outputs[0].text


def test_stream_yields_the_same_tokens_as_generate(llm):
    params = SamplingParams(temperature=0, max_tokens=20)
    full = llm.generate("Once upon a time", params)[0].outputs[0]
    pieces = list(llm.stream("Once upon a time", params))
    assert len(pieces) >= 3
    assert all(not p.finished for p in pieces[:-2]) and pieces[-1].finished
    text = "".join(p.outputs[0].text for p in pieces if p.outputs)
    ids = [t for p in pieces for o in p.outputs for t in o.token_ids]
    assert text == full.text and ids == full.token_ids
    assert pieces[-1].metrics.latency > 0


def test_closing_a_stream_aborts_it(llm):
    it = llm.stream("Count to one hundred:", SamplingParams(temperature=0, max_tokens=200))
    first = next(it)
    assert first.outputs[0].token_ids
    it.close()
    # The engine holds nothing of it: a batch afterwards runs alone and finishes.
    out = llm.generate("The sky is", GREEDY)[0]
    assert out.finished
    assert llm.stats()["steps"] > 0


def test_stream_interleaves_with_a_batch(llm):
    params = SamplingParams(temperature=0, max_tokens=12)
    alone = llm.generate("Water boils at", params)[0].outputs[0].token_ids
    it = llm.stream("Water boils at", params)
    got = list(next(it).outputs[0].token_ids)
    batch = llm.generate(["The moon is", "Bread is made of"], params)  # steps the stream's request too
    assert all(b.finished for b in batch)
    for piece in it:
        for o in piece.outputs:
            got += o.token_ids
    assert got == alone


def test_sampling_parameters(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=16)
    a = llm.generate("My favourite food is", seeded)[0].outputs[0]
    b = llm.generate("My favourite food is", seeded)[0].outputs[0]
    assert a.token_ids == b.token_ids  # a seed reproduces
    n3 = llm.generate("Pick a number:", SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8))[0]
    assert [o.index for o in n3.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in n3.outputs}) > 1
    length = llm.generate("Tell me a story.", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert len(length.token_ids) == 5 and length.finish_reason == "length"
    base = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text
    stop_at = base.strip().split(",")[1].strip()  # a piece the greedy text is known to contain
    stopped = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12, stop=[stop_at]))[0]
    assert stopped.outputs[0].finish_reason == "stop"
    assert stopped.outputs[0].stop_reason == stop_at
    assert stop_at not in stopped.outputs[0].text


def test_logprobs(llm):
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=6, logprobs=3))[0]
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids)
    for tid, step in zip(c.token_ids, c.logprobs):
        assert tid in step
        assert step[tid].rank == 1  # greedy picks the top token
        assert len(step) >= 3
        assert all(lp.logprob <= 0 for lp in step.values())
        assert isinstance(step[tid].decoded_token, str)
    assert c.cumulative_logprob == pytest.approx(sum(s[t].logprob for t, s in zip(c.token_ids, c.logprobs)))


def test_structured_output(llm):
    so = StructuredOutputsParams(regex=r"[0-9]{3}-[0-9]{4}")
    out = llm.generate("Call me at", SamplingParams(temperature=0.7, seed=3, max_tokens=20, structured_outputs=so))[0]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", out.outputs[0].text), out.outputs[0].text
    choice = StructuredOutputsParams(choice=["yes", "no"])
    out = llm.generate("Is water wet? Answer:", SamplingParams(temperature=0, max_tokens=5, structured_outputs=choice))
    assert out[0].outputs[0].text in ("yes", "no")


def test_bad_arguments_raise_clear_errors(llm):
    with pytest.raises(ParamError) as e:
        llm.generate("x", SamplingParams(temperature=-1))
    assert e.value.param == "temperature"
    with pytest.raises(ParamError) as e:
        llm.generate("x", SamplingParams(top_p=0))
    assert e.value.param == "top_p"
    with pytest.raises(ParamError):
        llm.generate("x", SamplingParams(logit_bias={10**9: 1.0}))
    with pytest.raises(ParamError) as e:
        llm.generate("x", SamplingParams(prompt_logprobs=1))  # not produced yet, refused by name
    assert e.value.param == "prompt_logprobs"
    with pytest.raises(ValueError):  # ParamError is a ValueError
        llm.generate("x", SamplingParams(max_tokens=0))
    with pytest.raises(TypeError):
        SamplingParams(no_such_field=1)
    with pytest.raises(TypeError):
        llm.generate(42)
    with pytest.raises(ValueError):
        llm.generate(["a", "b"], [GREEDY])
    with pytest.raises(ValueError):
        llm.generate({"prompt_token_ids": []}, GREEDY)
    with pytest.raises(ValueError):
        llm.generate({"prompt_token_ids": [-5]}, GREEDY)
    with pytest.raises(ValueError):
        llm.chat([{"role": "user", "content": "x" * 20000}], SamplingParams(max_tokens=4))  # beyond max_model_len
    # The engine is unharmed.
    assert llm.generate("The sky is", GREEDY)[0].finished


def test_bad_engine_arguments():
    with pytest.raises(TypeError, match="no_such_arg"):
        LLM(no_such_arg=1)
    with pytest.raises(ValueError, match="max-num-seqs"):
        LLM(max_num_seqs=0)
    with pytest.raises(ValueError):
        LLM(model="/nonexistent/model.gguf")
    with pytest.raises(ValueError):
        LLM(speculative_config={"method": "nonsense"})


def test_the_gil_is_released_while_generating(llm):
    ticks = 0
    done = threading.Event()

    def run():
        llm.generate([f"Write a long poem about the sea, part {i}." for i in range(8)],
                     SamplingParams(temperature=0, max_tokens=160, ignore_eos=True))
        done.set()

    t = threading.Thread(target=run)
    start = time.monotonic()
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    elapsed = time.monotonic() - start
    # The main thread kept running throughout: with the GIL held it would tick
    # only between Python bytecodes of the generating thread, i.e. hardly at all.
    assert elapsed > 0.2
    assert ticks > elapsed * 100, (ticks, elapsed)


def test_speculative_engine_gives_the_same_greedy_text():
    prompt = "Repeat after me: the quick brown fox jumps over the lazy dog. the quick brown fox"
    params = SamplingParams(temperature=0, max_tokens=24)
    plain = LLM(max_model_len=1024, threads=2).generate(prompt, params)[0].outputs[0]
    spec = LLM(max_model_len=1024, threads=2, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    out = spec.generate(prompt, params)[0]
    assert out.outputs[0].token_ids == plain.token_ids
    assert out.metrics.num_verifications > 0


def test_version_and_exports():
    assert deepinfer.__version__
    for name in deepinfer.__all__:
        assert hasattr(deepinfer, name)


def test_calls_from_another_thread_wait_for_a_running_batch(llm):
    # stats() and a stream's take wait on the engine while a batch in another
    # thread holds it; neither may keep the GIL while waiting (the batch's
    # progress callback needs it), or both threads would hang.
    result = {}

    def run():
        result["outs"] = llm.generate([f"Tell a story number {i}." for i in range(8)],
                                      SamplingParams(temperature=0, max_tokens=96, ignore_eos=True), use_tqdm=True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.05)
    stats = [llm.stats() for _ in range(3)]
    pieces = list(llm.stream("Hi", SamplingParams(temperature=0, max_tokens=4)))
    t.join(timeout=120)
    assert not t.is_alive(), "deadlock: the batch did not finish"
    assert len(result["outs"]) == 8 and all(o.finished for o in result["outs"])
    assert all(s["steps"] >= 0 for s in stats)
    assert pieces[-1].finished
