#!/usr/bin/env python3
"""Writes generated seeds for one fuzz target into a corpus folder: inputs of
the classes a hostile-input run found (deep nesting, huge counts, objects of
many keys, numbers that wrap), so that libFuzzer starts next to them instead of
having to grow them from the checked-in seeds. tests/fuzz/run.sh calls it for
every target; the checked-in corpus stays small.

    gen_seeds.py TARGET OUT_DIR
"""
import json
import pathlib
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPTHS = (200, 2000, 8000)
MAX_SEED = 16 << 10  # run.sh fuzzes with -max_len 16384: longer seeds would be cut
COUNTS = (-1, 0, 64.5, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63, 10**9, 1e300)


def nested(depth, inner="1", kind="array"):
    if kind == "array":
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + inner + "}" * depth


def many_keys(n):
    return "{" + ",".join('"k%d":%d' % (i, i) for i in range(n)) + "}"


def json_bombs():
    for d in DEPTHS:
        yield f"nest_array_{d}", nested(d)
        yield f"nest_object_{d}", nested(d, kind="object")
    yield "many_keys", many_keys(1000)


# --- per target ---------------------------------------------------------------

def safetensors_seeds():
    def file(header):
        h = header.encode()
        return struct.pack("<Q", len(h)) + h + b"\0" * 8
    for d in DEPTHS:
        yield f"shape_nested_{d}", file('{"t":{"dtype":"F32","shape":[%s],"data_offsets":[0,4]}}' % nested(d))
    yield "rank_many", file('{"t":{"dtype":"U8","shape":[%s],"data_offsets":[0,1]}}' % ",".join(["1"] * 2000))
    for c in COUNTS:
        yield f"dim_{c}", file('{"t":{"dtype":"F32","shape":[%s],"data_offsets":[0,4]}}' % json.dumps(c))


def tokenizer_json_seeds():
    base = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}
    for d in DEPTHS:
        norm = '{"type":"NFC"}'
        for _ in range(d):
            norm = '{"type":"Sequence","normalizers":[%s]}' % norm
        yield f"normalizer_sequence_{d}", json.dumps(base)[:-1] + ',"normalizer":' + norm + "}"
        pre = '{"type":"Whitespace"}'
        for _ in range(min(d, 5000)):
            pre = '{"type":"Sequence","pretokenizers":[%s]}' % pre
        yield f"pre_tokenizer_sequence_{d}", json.dumps(base)[:-1] + ',"pre_tokenizer":' + pre + "}"
    for c in COUNTS:
        doc = json.loads(json.dumps(base))
        doc["model"]["vocab"]["c"] = c
        yield f"vocab_id_{c}", json.dumps(doc)
    byte_levels = [{"type": "ByteLevel", "add_prefix_space": False}] * 24
    yield "byte_level_chain", json.dumps(dict(base, pre_tokenizer={"type": "Sequence", "pretokenizers": byte_levels}))
    yield "vocab_many", json.dumps({"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(1000)}, "merges": []}})


def server_request_seeds():
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for d in DEPTHS:
        yield f"messages_nested_{d}", "\x00" + '{"model":"m","messages":%s}' % nested(d)
        args = json.dumps(nested(d))  # JSON nested inside a string: tool-call arguments
        msgs = [{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                      "function": {"name": "f", "arguments": "@"}}]}]
        yield f"tool_arguments_nested_{d}", "\x00" + json.dumps(dict(chat, messages=msgs)).replace('"@"', args)
    yield "logit_bias_many", "\x00" + json.dumps(dict(chat, logit_bias={str(i): 1 for i in range(1000)}))
    yield "unknown_many_keys", "\x00" + json.dumps(chat)[:-1] + ',"junk":' + many_keys(1000) + "}"
    yield "template_kwargs_messages", "\x00" + json.dumps(dict(chat, chat_template_kwargs={"messages": [{"role": "user", "content": "x"}] * 50}))
    for c in COUNTS:
        yield f"max_tokens_{c}", "\x01" + json.dumps({"model": "m", "prompt": "x", "max_tokens": c, "n": c})


def output_parser_seeds():
    for d in (200, 1000):  # run.sh fuzzes this target with -max_len 4096
        call = '{"name":"f","arguments":%s}' % nested(d)
        yield f"hermes_nested_{d}", "\x00<think>x</think><tool_call>" + call + "</tool_call>"
        yield f"llama_nested_{d}", "\x01" + call
    yield "hermes_many_keys", "\x00<tool_call>" + '{"name":"f","arguments":%s}' % many_keys(300) + "</tool_call>"


def chat_template_seeds():
    for d in (200, 2000):
        yield f"parens_{d}", "{{ " + "(" * d + "1" + ")" * d + " }}"
        yield f"ifs_{d}", "{% if true %}" * d + "x" + "{% endif %}" * d
        yield f"list_{d}", "{{ " + "[" * d + "]" * d + " }}"


def gguf_kv(key, type_id, payload):
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", type_id) + payload


def gguf_file(kvs, tensors):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    for name, dims, offset in tensors:
        n = name.encode()
        out += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 0, offset)
    out += b"\0" * ((32 - len(out) % 32) % 32)
    return out + b"\0" * 512


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def model_config_seeds():
    for cfg in sorted((ROOT / "tests" / "data" / "hf_tiny").glob("*/config.json")):
        text = cfg.read_text()
        yield f"hf_{cfg.parent.name}", text
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            for c in (2**31 - 1, 2**40, 64.5, 10**9):
                doc = json.loads(text)
                doc.get("text_config", doc)[key] = c
                yield f"hf_{cfg.parent.name}_{key}_{c}", json.dumps(doc)
    for arch in ("llama", "gemma3", "qwen2"):
        for c in (1, 2**31 - 1, 2**32 - 1, 10**9, 2**40):
            kvs = [gguf_kv("general.architecture", 8, gguf_string(arch)),
                   gguf_kv(f"{arch}.block_count", 10, struct.pack("<Q", c)),
                   gguf_kv(f"{arch}.embedding_length", 4, struct.pack("<I", 8)),
                   gguf_kv(f"{arch}.feed_forward_length", 4, struct.pack("<I", 16)),
                   gguf_kv(f"{arch}.attention.head_count", 4, struct.pack("<I", 2)),
                   gguf_kv(f"{arch}.context_length", 10, struct.pack("<Q", c)),
                   gguf_kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 4) + b"".join(gguf_string(f"t{i}") for i in range(4)))]
            yield f"gguf_{arch}_{c}", gguf_file(kvs, [("token_embd.weight", (8, 4), 0), ("blk.0.attn_norm.weight", (8,), 128)])


def router_request_seeds():
    # The server's request seeds with the first byte picking the router's path.
    for name, content in server_request_seeds():
        yield "router_" + name, content
    conv = [{"role": "system", "content": "s" * 300}, {"role": "user", "content": "q"}]
    yield "chat_long_system", "\x00" + json.dumps({"model": "m", "messages": conv, "stream": True})
    yield "messages_system_blocks", "\x03" + json.dumps({"system": [{"type": "text", "text": "x" * 200}],
                                                         "messages": conv[1:], "max_tokens": 3})
    yield "completion_token_ids", "\x01" + json.dumps({"prompt": list(range(500)), "stream_options": {}})


def tcp_store_seeds():
    # The first byte picks request (even) or reply (odd); then one frame.
    def frame(body):
        return struct.pack("<I", len(body)) + body

    def key(k):
        return struct.pack("<I", len(k)) + k

    yield "set", b"\x00" + frame(b"\x01" + key(b"rank_0") + struct.pack("<I", 5) + b"host0")
    yield "get", b"\x00" + frame(b"\x02" + key(b"deepinfer/tp/1"))
    yield "wait", b"\x00" + frame(b"\x03" + struct.pack("<I", 3) + b"".join(key(b"k%d" % i) for i in range(3)))
    yield "wait_many", b"\x00" + frame(b"\x03" + struct.pack("<I", 1024) + key(b"k") * 1024)
    for c in (0, 4097, 2**31, 2**32 - 1):
        yield f"key_len_{c}", b"\x00" + frame(b"\x02" + struct.pack("<I", c) + b"k")
        yield f"value_len_{c}", b"\x00" + frame(b"\x01" + key(b"k") + struct.pack("<I", c) + b"v")
        yield f"wait_count_{c}", b"\x00" + frame(b"\x03" + struct.pack("<I", c) + key(b"k"))
        yield f"frame_len_{c}", b"\x00" + struct.pack("<I", c) + b"\x02" + key(b"k")
    yield "reply_ok", b"\x01" + frame(b"\x00" + b"value")
    yield "reply_error", b"\x01" + frame(b"\x01" + b"the store is full")


TARGETS = {
    "tcp_store": tcp_store_seeds,
    "router_request": router_request_seeds,
    "safetensors": safetensors_seeds,
    "tokenizer_json": tokenizer_json_seeds,
    "server_request": server_request_seeds,
    "chat_template": chat_template_seeds,
    "output_parser": output_parser_seeds,
    "model_config": model_config_seeds,
}


def main():
    target, out = sys.argv[1], pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(TARGETS.get(target, lambda: [])())
    if target in ("tokenizer_json", "model_config"):
        seeds += list(json_bombs())
    written = 0
    for name, content in seeds:
        data = content.encode() if isinstance(content, str) else content
        if len(data) > MAX_SEED:
            continue  # the same class is covered by a shallower seed
        (out / f"gen_{name}").write_bytes(data)
        written += 1
    print(f"gen_seeds: {written} seeds for {target}")


if __name__ == "__main__":
    main()
