#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/cases.jsonl: strings with the ids HF `tokenizers` gives.

Each line is one JSON object:
  {"cat": category, "text": str, "ids": [int], "decoded": str, "decoded_skip": str}
or, for byte strings that are not valid UTF-8,
  {"cat": "invalid_utf8", "hex": hex of the raw bytes, "ids": [...], "decoded": ..., ...}
where ids = encode(bytes.decode("utf-8", "replace"), add_special_tokens=False) — the lossy
replacement charm applies to invalid input. "decoded" is decode(ids,
skip_special_tokens=False), "decoded_skip" the same with skip_special_tokens=True.
"nfc_changes": true marks texts that NFC normalisation alters (they test the normalizer).

Deterministic: a fixed seed and fixed pools, so reruns give an identical file.
Usage: scripts/gen_tokenizer_cases.py [--tokenizer DIR] [--out FILE] [--count N]
"""
from __future__ import annotations

import argparse
import json
import random
import unicodedata
from pathlib import Path

SEED = 20260130

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Mixture-of-experts models route each token to a few experts out of many.",
    "Please summarise the following paragraph in two sentences.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out first.",
    "She sells sea shells by the sea shore.",
    "Hello world! How are you doing today?",
    "The committee's decision wasn't final: they'd revisit it next week.",
    "E-mail me at someone@example.com or call +1 (555) 010-9999.",
    "Prices rose 3.7% year-over-year, reaching $1,234,567.89 in Q3.",
    "WHY ARE YOU SHOUTING?! I'M NOT SHOUTING.",
    "camelCaseIdentifiers and snake_case_names and kebab-case-names",
    "https://www.example.org/path/to/page?query=1&lang=en#section-2",
    "Dr. Smith et al. (2021) reported p < 0.05, i.e. significant.",
    "Don't you think it's odd that we've never met, yet you'll know me?",
    "A tokenizer splits text into pieces; a model maps pieces to vectors.",
]
WORDS = ("time person year way day thing man world life hand part child eye woman place "
         "work week case point government company number group problem fact be have do say "
         "get make go know take see come think look want give use find tell ask seem feel "
         "try leave call good new first last long great little own other old right big high "
         "different small large next early young important few public bad same able to of "
         "in for on with at by from up about into over after the and a that I it not he as "
         "you this but his they her she or an will my one all would there their tokenization "
         "antidisestablishmentarianism supercalifragilistic internationalization").split()
CONTRACTIONS = ["it's", "don't", "they're", "I've", "I'm", "we'll", "he'd", "IT'S", "DON'T",
                "They'RE", "You'Ve", "I'M", "We'LL", "She'D", "'s", "'t", "'re", "'ve", "'m",
                "'ll", "'d", "rock'n'roll", "o'clock", "'quoted'", "y'all'd've"]
CODE = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }\n",
    "fn main() {\n    let x: Vec<u8> = vec![0xff; 16];\n    println!(\"{:?}\", x);\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
    "func main() {\n\tfmt.Println(\"hello\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "<div class=\"box\"><p>Hi &amp; bye</p></div>\n",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "    if (x != nullptr && *x == '\\n') { return -1; }\r\n",
    "class Foo:\n    def __init__(self):\n        self._x = {}\n\n\n",
    "x = [i**2 for i in range(10) if i % 3 == 0]  # squares\n",
    "matrix := [][]float64{{1, 0}, {0, 1}}\n",
    "public static void main(String[] args) throws IOException {}\n",
    "ls -la | grep '^d' | awk '{print $9}' >> out.log 2>&1",
]
CHINESE = ["今天天气很好，我们去公园散步吧。", "混合专家模型把每个词元分配给少数专家。",
           "我爱北京天安门。", "人工智能正在改变世界。", "请用中文回答：三加五等于几？"]
JAPANESE = ["今日は良い天気ですね。", "東京タワーに行きたいです！", "ひらがなとカタカナと漢字。",
            "吾輩は猫である。名前はまだ無い。"]
KOREAN = ["안녕하세요, 만나서 반갑습니다.", "한국어 형태소 분석은 어렵다.", "오늘 날씨가 좋네요!"]
ARABIC = ["مرحبا بالعالم", "اللغة العربية جميلة جداً.", "السَّلَامُ عَلَيْكُمْ"]
HINDI = ["नमस्ते दुनिया", "भारत एक विशाल देश है।", "मुझे हिंदी पढ़ना पसंद है।"]
RUSSIAN = ["Привет, мир!", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
           "Москва — столица России."]
GREEK = ["Γειά σου Κόσμε!", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "αβγδεζηθικλμνξοπρστυφχψω"]
EMOJI = ["😀", "🦙", "👍", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈",
         "🇯🇵", "🇺🇸", "❤️", "🧑‍🚀", "🤷‍♂️", "👋🏿", "🫶", "🐈‍⬛", "✅", "🔥🔥🔥", "™", "©"]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ",
              " \t\n", "\u00a0", "\u3000", "\u2009", "\r", "\x0b", "\x0c"]
PUNCT = ["!", "!!!", "?", "?!?!", "...", "…", "---", "—", "***", "```", ":)", ";-)", "()",
         "[]", "{}", "<>", "<<=", "->", "=>", "::", "&&", "||", "##", "@@", "%%", "\"\"", "''",
         "``", ",,", "..", "/*", "*/", "//", "~~~", "^_^", "¿¡", "«»", "“”", "‘’", "、。", "！？"]
NFC_CHANGING = ["e\u0301", "A\u030a", "\u212b", "\u1100\u1161\u11a8", "o\u0308\u0304",
                "\u0958", "n\u0303", "C\u0327", "\u2126", "a\u0328\u0301", "\u0344",
                "\u1e9b\u0323", "\u0929", "\u0915\u093c"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
           "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
           "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
           "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
           "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
           "<tool_response>", "</tool_response>", "<think>", "</think>"]
NEAR_SPECIAL = ["<|im_start", "im_end|>", "<|im_end |>", "< think>", "<think", "</think",
                "<|IM_START|>", "<|endoftext|", "<<|im_start|>>", "<tool_call"]
# Script blocks for random character soup: (first, last) code points.
SCRIPT_RANGES = {
    "chinese": (0x4E00, 0x9FFF), "japanese": (0x3041, 0x30FF), "korean": (0xAC00, 0xD7A3),
    "arabic": (0x0621, 0x064A), "hindi": (0x0905, 0x0939), "russian": (0x0410, 0x044F),
    "greek": (0x0391, 0x03C9), "latin_ext": (0x00C0, 0x024F), "math": (0x2200, 0x22FF),
    "emoji": (0x1F300, 0x1F64F),
}


def random_number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    if kind == 0:
        return digits
    if kind == 1:
        return f"{rng.randint(0, 10**6)}.{rng.randint(0, 10**4)}"
    if kind == 2:
        return f"{rng.randint(1, 999)},{rng.randint(100, 999)},{rng.randint(100, 999)}"
    if kind == 3:
        return f"-{rng.random() * 10 ** rng.randint(-5, 5):.6e}"
    if kind == 4:
        return "0x" + "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(8))
    return f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def random_words(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.3:
        words[0] = words[0].capitalize()
    return " ".join(words)


def script_soup(rng: random.Random, name: str) -> str:
    lo, hi = SCRIPT_RANGES[name]
    out = []
    for _ in range(rng.randint(1, 6)):
        out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
    return rng.choice([" ", "", "\n", ", "]).join(out)


def fragment(rng: random.Random, cat: str) -> str:
    """One random piece of text in category `cat`."""
    pools = {"english": ENGLISH, "code": CODE, "chinese": CHINESE, "japanese": JAPANESE,
             "korean": KOREAN, "arabic": ARABIC, "hindi": HINDI, "russian": RUSSIAN,
             "greek": GREEK}
    if cat in pools:
        if cat in SCRIPT_RANGES and rng.random() < 0.4:
            return script_soup(rng, cat)
        return rng.choice(pools[cat])
    if cat == "words":
        return random_words(rng, rng.randint(1, 20))
    if cat == "emoji":
        return "".join(rng.choice(EMOJI) + rng.choice(["", " ", ""]) for _ in range(rng.randint(1, 5)))
    if cat == "whitespace":
        return "".join(rng.choice(WHITESPACE) + rng.choice(["", "a", "word", "x1", ""])
                       for _ in range(rng.randint(1, 6)))
    if cat == "digits":
        return rng.choice(["", "x=", "$", "v", " ", "№"]) + random_number(rng)
    if cat == "contractions":
        return " ".join(rng.choice(CONTRACTIONS + WORDS[:20]) for _ in range(rng.randint(1, 8)))
    if cat == "punct":
        return "".join(rng.choice(PUNCT) + rng.choice(["", " ", "a", ""]) for _ in range(rng.randint(1, 6)))
    if cat == "special":
        return chat_like(rng)
    if cat == "nfc":
        return rng.choice(NFC_CHANGING) + rng.choice(["", " ", "x", "\u0301"]) + rng.choice(WORDS)
    if cat == "soup":
        return script_soup(rng, rng.choice(sorted(SCRIPT_RANGES)))
    raise ValueError(cat)


def chat_like(rng: random.Random) -> str:
    """Text with added tokens written inside it, as a chat template renders them."""
    kind = rng.randrange(4)
    if kind == 0:
        role = rng.choice(["user", "assistant", "system", "tool"])
        body = fragment(rng, rng.choice(["english", "chinese", "code", "words"]))
        return f"<|im_start|>{role}\n{body}<|im_end|>\n"
    if kind == 1:
        return (f"<|im_start|>assistant\n<think>\n{random_words(rng, 6)}\n</think>\n\n"
                f"{random_words(rng, 4)}<|im_end|>")
    if kind == 2:
        return "".join(rng.choice(SPECIAL + NEAR_SPECIAL + [" ", "\n", "a", "x "])
                       for _ in range(rng.randint(1, 8)))
    return (f"<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"x\": {rng.randint(0, 99)}}}}}"
            f"\n</tool_call><|endoftext|>")


def invalid_bytes(rng: random.Random) -> bytes:
    """A byte string that is not valid UTF-8, built from typical defects."""
    defects = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
               b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xc3", b"\xe4\xb8", b"\xf0\x9f\x98",
               b"\xf0\x9f", b"\xe2\x82", b"\xc3\x28", b"\xa0\xa1", b"\xf5", b"\xc1\xbf"]
    parts = []
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.5:
            parts.append(fragment(rng, rng.choice(["english", "chinese", "emoji", "words"])).encode())
        parts.append(rng.choice(defects))
    if rng.random() < 0.2:
        parts.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 12))))
    data = b"".join(parts)
    try:
        data.decode("utf-8")
        return data + b"\xff"
    except UnicodeDecodeError:
        return data


CATEGORIES = ["english", "words", "code", "chinese", "japanese", "korean", "arabic", "hindi",
              "russian", "greek", "emoji", "whitespace", "digits", "contractions", "punct",
              "special", "soup"]


def generate_texts(rng: random.Random, count: int) -> list[tuple[str, str | bytes]]:
    """(category, text or bytes) pairs: fixed edge cases, then seeded random ones."""
    cases: list[tuple[str, str | bytes]] = [("edge", s) for s in [
        "", " ", "\n", "\r\n", "a", "A", "0", "00", "1234567890", "  leading", "trailing  ",
        "trailing\n", "x \n y", "a  b   c", "\t\tindent", "\n\n\n", " \n \n ", "'s", "'S",
        "it'S", "<|im_start|>", "<|im_start|><|im_end|>", "<|endoftext|>hi", "hi<|endoftext|>",
        "Ġ", "Ċ", "ĠĠ", "\u00ad", "\ufeffbom", "\u200b", "\ufffd", "\x00", "\x7f", "𝕳𝖊𝖑𝖑𝖔",
    ]]
    for s in NFC_CHANGING:
        cases.append(("nfc", s))
    for s in SPECIAL + NEAR_SPECIAL + CONTRACTIONS + PUNCT + EMOJI + WHITESPACE:
        cases.append(("atoms", s))
    for pool in (ENGLISH, CODE, CHINESE, JAPANESE, KOREAN, ARABIC, HINDI, RUSSIAN, GREEK):
        cases.extend(("sentences", s) for s in pool)
    n_invalid = count // 12
    n_nfc = count // 50
    while len(cases) < count - n_invalid - n_nfc:
        if rng.random() < 0.35:  # mixed text: a few fragments from different categories
            parts = [fragment(rng, rng.choice(CATEGORIES)) for _ in range(rng.randint(2, 5))]
            cases.append(("mixed", rng.choice(["", " ", "\n"]).join(parts)))
        else:
            cat = rng.choice(CATEGORIES)
            cases.append((cat, fragment(rng, cat)))
    for _ in range(n_nfc):
        cases.append(("nfc", fragment(rng, "nfc") + " " + fragment(rng, rng.choice(CATEGORIES))))
    for _ in range(n_invalid):
        cases.append(("invalid_utf8", invalid_bytes(rng)))
    return cases


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, default=root / "tests/fixtures/tokenizer")
    parser.add_argument("--out", type=Path, default=root / "tests/fixtures/tokenizer/cases.jsonl")
    parser.add_argument("--count", type=int, default=2400)
    args = parser.parse_args()

    import tokenizers  # imported here so --help works without it

    tok = tokenizers.Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    rng = random.Random(SEED)
    with open(args.out, "w", encoding="utf-8") as f:
        for cat, item in generate_texts(rng, args.count):
            text = item.decode("utf-8", "replace") if isinstance(item, bytes) else item
            ids = tok.encode(text, add_special_tokens=False).ids
            row = {"cat": cat}
            if isinstance(item, bytes):
                row["hex"] = item.hex()
            else:
                row["text"] = text
            row["ids"] = ids
            row["decoded"] = tok.decode(ids, skip_special_tokens=False)
            row["decoded_skip"] = tok.decode(ids, skip_special_tokens=True)
            if unicodedata.normalize("NFC", text) != text:
                row["nfc_changes"] = True
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
