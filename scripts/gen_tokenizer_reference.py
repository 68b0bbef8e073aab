#!/usr/bin/env python3
"""Reference ids for the tokenizer tests, from Hugging Face `tokenizers`.

For each family in ../shared/tokenizers and for the SmolLM2 GGUF vocabulary, writes
tests/data/tokenizer/<name>.jsonl.xz: one JSON object per text with
  text, ids (add_special_tokens=False), ids_special (add_special_tokens=True),
  decoded (decode(ids_special, skip_special_tokens=False)),
  decoded_skip (decode(ids_special, skip_special_tokens=True)).

SmolLM2: llama-cpp-python is not available here, so the reference is HF `tokenizers`
running a tokenizer.json rebuilt from the GGUF's own vocab/merges/token types with
SmolLM2's published pre-tokenizer (Digits(individual) + ByteLevel regex), which is
what llama.cpp's "smollm" pre-tokenizer name stands for.
Gemma 3 GGUF: its vocabulary is checked to equal the gemma3 tokenizer.json's, so
the tests compare it against gemma3.jsonl.xz.

Usage: pip install tokenizers gguf; python3 scripts/gen_tokenizer_reference.py
"""
import json
import lzma
import os
import random
import sys
import tempfile

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "tokenizers")
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
FAMILIES = ["deepseek_v3", "qwen3", "llama3_1", "gptoss", "gemma3"]


def texts():
    t = [
        "", " ", "  ", "\n", "\t", "\r\n", "a", "Hello", "Hello world", " Hello world", "Hello world ",
        "Hello, world! How are you today?", "The quick brown fox jumps over the lazy dog.",
        "I'm sure you'll like it; they've said we'd go. It's John's.", "DON'T SHOUT, IT'S LOUD'S",
        "Привет, как дела? Это тест на русском языке.", "Съешь же ещё этих мягких французских булок.",
        "Γειά σου Κόσμε! Η γρήγορη καφέ αλεπού.", "مرحبا بالعالم، كيف حالك اليوم؟", "שלום עולם, מה שלומך?",
        "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก คุณสบายดีไหม", "你好，世界！今天天气很好。", "我爱自然语言处理和机器学习",
        "こんにちは世界、カタカナとひらがな。", "東京は日本の首都です。", "안녕하세요 세계, 잘 지내세요?", "한국어 형태소 분석기",
        "Ελληνικά και English mixed με 123 αριθμούς", "Tiếng Việt có dấu: Điều này thật tuyệt vời.",
        "Zażółć gęślą jaźń. Příliš žluťoučký kůň.", "Æbleskiver, smørrebrød og blåbærsyltetøy.",
        "ქართული ენა", "Հայերեն լեզու", "ትግርኛ ቋንቋ", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "தமிழ் மொழி", "বাংলা ভাষা",
        "def foo(x):\n    return x * 2\n", "int main() {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
        "for (let i = 0; i < n; ++i) { console.log(`value: ${i}`); }",
        "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}",
        "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;", "<div class=\"x\"><p>Hi</p></div>",
        "#include <vector>\ntemplate <typename T> struct S { T t; };", "x = [i**2 for i in range(10) if i % 2 == 0]",
        "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}", "$ ls -la /usr/bin | grep -E '^d' && echo ok",
        "    indented with four spaces", "\t\ttabs\tand\tspaces  mixed \t ", "trailing spaces   ", "   leading spaces",
        "line1\nline2\n\nline4\n\n\n", "windows\r\nline\r\nendings\r\n", "a\u00a0b\u2003c\u3000d", "zero\u200bwidth\u200djoiner",
        "0", "7", "42", "123", "1234", "12345", "123456", "1234567", "12345678901234567890", "3.14159265358979",
        "-0.001", "1,000,000", "1e-9", "2024-01-15T12:30:00Z", "+1 (555) 123-4567", "٣٤٥ and ४५६ and ๓๔๕", "①②③ ¼ ½ Ⅻ",
        "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "🇺🇸🇬🇧🇯🇵🇩🇪", "I ❤️ NY", "emoji😀inside😃words", "🤖 robots 🦾",
        "café", "cafe\u0301", "naïve résumé", "nai\u0308ve re\u0301sume\u0301", "Å Å Å", "ﬁ ﬂ ﬃ", "Ｆｕｌｌｗｉｄｔｈ", "ǅ ǈ ǋ",
        "<|im_start|>", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "<bos>", "<eos>", "<bos>Hello<eos>",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "<|endoftext|>", "<|startoftext|>text<|return|>", "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>", "<s> </s> <unk> <pad>",
        "<|im_start|><|im_start|>", "< |im_start| >", "<|im_start", "text<|im_end|>more text", "<think>\nreasoning\n</think>\n\nanswer",
        "a" * 500, "abc" * 300, "supercalifragilisticexpialidocious" * 20, "x" * 1000 + " y", "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "🙂" * 100, "中" * 200, "\n" * 40, " " * 50, "\t" * 20, "-" * 80, "=" * 33 + ">" , "." * 17,
        "mixed中文English日本語한국어", "abc123def456", "CamelCaseWordsHere", "snake_case_words_here", "kebab-case-words",
        "email@example.com https://example.org/path?q=1&r=2#frag", "C:\\Users\\name\\file.txt", "@user #hashtag $100 %50 ^caret",
        "'quoted' \"double\" `backtick` «guillemets» „Anführung“ 「括弧」", "—em dash– en dash ‐ hyphen", "…ellipsis…",
        "ÀÁÂÃÄÅ àáâãäå ÇçÑñ", "ß ẞ İ ı ŉ", "ΑΒΓ αβγ ΣΣ σς", "Ꭰ Ꮎ", "\ufeffBOM at start", "soft\u00adhyphen", "\u2028line sep\u2029para sep",
        "\u0000null\u0001ctrl\u007f", "\x1b[31mred\x1b[0m", "tab\there", "\u00a0\u00a0nbsp", "\u180emongolian", "\u0085nextline",
        "control chars \u0002\u0003\u0004", "  \n  \n", " \t \n \r ", "word\n", "\nword", "a\n\nb", "a \n b", "!!!???", "...!!!,,,",
        "U.S.A. e.g. i.e. etc.", "don't won't can't shouldn't", "it's IT'S It'S", "l'homme d'État", "rock'n'roll",
        "Ünïcödé Tëxt", "Ωmega", "ʻOkina", "Ŋŋ", "ꙮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟏𝟐𝟑", "𐍈 gothic", "𓀀 hieroglyph", "\U0010FFFD private",
        "\ue000 PUA", "replacement \ufffd char", "ﷺ", "ﷲ", "ǂ", "ɐ ɔ ə", "ʃ ʒ ŋ θ ð", "①", "™ © ®", "€ £ ¥ ₹ ₿", "∑∫√∞≈≠≤≥",
        "→←↑↓⇒⇔", "♠♣♥♦", "☃☂☀", "⌘⌥⇧", "░▒▓█", "┌─┐│└┘", "ℕ ℤ ℚ ℝ ℂ", "x² + y² = z²", "H₂O CO₂", "°C °F",
    ]
    rng = random.Random(1234)
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r", ".,;:!?'\"()[]{}<>-_+=*/\\|@#$%^&~`",
        "абвгдежзийклмнопрстуфхцчшщъыьэюя", "αβγδεζηθικλμνξοπρστυφχψω", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "אבגדהוזחטיכלמנסעפצקרשת",
        "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह्ािीुूेैोौ", "กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรลวศษสหฬอฮะาิีึืุู",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年", "あいうえおかきくけこアイウエオカキクケコ", "가나다라마바사아자차카타파하한국어",
        "😀😃😄😁😆🥹😅😂🤣🥲☺️😊😇🙂🙃😉👍👎👏🙏🔥✨🎉", "\u0301\u0308\u0327\u200d\ufe0f", "éèêëàâäôöûüçñ",
    ]
    for n in range(1, 31):
        t.append("".join(rng.choice("0123456789") for _ in range(n)))
    for _ in range(60):
        k = rng.randint(1, 60)
        t.append("".join(rng.choice(rng.choice(pools)) for _ in range(k)))
    for _ in range(30):
        words = []
        for _ in range(rng.randint(2, 15)):
            pool = rng.choice(pools)
            words.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        sep = rng.choice([" ", "  ", "\n", "\t", " \n", "", ", "])
        t.append(sep.join(words))
    specials = ["<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>",
                "<｜end▁of▁sentence｜>", "<|return|>", "<think>", "<unk>", "<mask>"]
    for _ in range(20):
        parts = []
        for _ in range(rng.randint(2, 6)):
            parts.append(rng.choice(specials) if rng.random() < 0.4 else rng.choice(t[:150]))
        t.append(rng.choice(["", " ", "\n"]).join(parts))
    seen, out = set(), []
    for s in t:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def write(name, tok, items):
    rows = []
    for text in items:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        rows.append({
            "text": text, "ids": ids, "ids_special": ids_special,
            "decoded": tok.decode(ids_special, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids_special, skip_special_tokens=True),
        })
    path = os.path.join(OUT, name + ".jsonl.xz")
    with lzma.open(path, "wt", encoding="utf-8", preset=9) as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{name}: {len(rows)} texts -> {path} ({os.path.getsize(path)} bytes)")


def smollm_from_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.merges"].data]
    assert bytes(f["tokenizer.ggml.pre"].parts[f["tokenizer.ggml.pre"].data[0]]).decode() == "smollm"
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }
    return Tokenizer.from_str(json.dumps(spec))


def check_gemma_gguf(path, hf_json):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    # llama.cpp's converter stores Gemma's user-defined whitespace tokens with " " where the
    # tokenizer.json has "\u2581"; Tokenizer::from_gguf maps them back.
    ty = r.fields["tokenizer.ggml.token_type"]
    tokens = [t.replace(" ", "\u2581") if int(ty.parts[i][0]) == 4 else t
              for t, i in zip(tokens, ty.data)]
    d = json.loads(hf_json)
    vocab = dict(d["model"]["vocab"])
    for a in d["added_tokens"]:
        vocab[a["content"]] = a["id"]
    mismatches = sum(1 for i, t in enumerate(tokens) if vocab.get(t) != i)
    print(f"gemma GGUF vs gemma3 tokenizer.json: {len(tokens)} tokens, {mismatches} mismatches")
    assert mismatches == 0


def main():
    os.makedirs(OUT, exist_ok=True)
    items = texts()
    print(f"{len(items)} texts")
    for fam in FAMILIES:
        if len(sys.argv) > 1 and fam not in sys.argv[1:]:
            continue
        with lzma.open(os.path.join(SHARED, fam, "tokenizer.json.xz"), "rt", encoding="utf-8") as f:
            js = f.read()
        tok = Tokenizer.from_str(js)
        write(fam, tok, items)
        if fam == "gemma3":
            check_gemma_gguf(os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"), js)
    write("smollm2_gguf", smollm_from_gguf(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")), items)


if __name__ == "__main__":
    sys.exit(main())
