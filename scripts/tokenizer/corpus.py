"""Deterministic tokenizer test corpus: >= 20,000 byte strings covering what breaks tokenizers.

Categories: vocabulary-derived prose, many scripts and languages, CJK/kana runs, emoji (ZWJ,
skin tones, flags, keycaps), combining marks, digit runs in several scripts, long whitespace and
newline runs, code in several languages, special-token text inside user input, a sweep over all
code points of planes 0-2 and 14, random code points, and invalid UTF-8 (kept as raw bytes).
Everything comes from one seeded RNG, so the corpus is reproducible from this file alone.
"""

from __future__ import annotations

import random

SCRIPTS = {
    "latin": [(0x41, 0x5A), (0x61, 0x7A)],
    "latin_ext": [(0xC0, 0x24F), (0x1E00, 0x1EFF)],
    "greek": [(0x391, 0x3A9), (0x3B1, 0x3C9)],
    "cyrillic": [(0x410, 0x44F), (0x400, 0x40F)],
    "armenian": [(0x531, 0x556), (0x561, 0x587)],
    "hebrew": [(0x5D0, 0x5EA)],
    "arabic": [(0x621, 0x64A), (0x660, 0x669)],
    "devanagari": [(0x905, 0x939), (0x93E, 0x94D)],
    "bengali": [(0x985, 0x9B9), (0x9BE, 0x9CC)],
    "tamil": [(0xB85, 0xBB9), (0xBBE, 0xBCD)],
    "thai": [(0xE01, 0xE3A), (0xE40, 0xE4E)],
    "lao": [(0xE81, 0xEB0)],
    "tibetan": [(0xF40, 0xF6C), (0xF71, 0xF84)],
    "georgian": [(0x10D0, 0x10FA)],
    "ethiopic": [(0x1200, 0x135A)],
    "cherokee": [(0x13A0, 0x13F4)],
    "khmer": [(0x1780, 0x17D3)],
    "mongolian": [(0x1820, 0x1878)],
    "hangul": [(0xAC00, 0xD7A3)],
    "hangul_jamo": [(0x1100, 0x11FF)],
    "hiragana": [(0x3041, 0x3096)],
    "katakana": [(0x30A1, 0x30FA)],
    "halfwidth_kana": [(0xFF66, 0xFF9D)],
    "cjk": [(0x4E00, 0x9FA5)],
    "cjk_beyond": [(0x9FA6, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF)],
    "fullwidth": [(0xFF01, 0xFF5E)],
    "math": [(0x1D400, 0x1D7FF), (0x2200, 0x22FF)],
    "symbols": [(0x2190, 0x21FF), (0x2500, 0x257F), (0x2600, 0x26FF), (0x20A0, 0x20C0)],
}

SAMPLE_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll agree: it's what we've done, isn't it?",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "Portez ce vieux whisky au juge blond qui fume — « déjà vu » !",
    "¿Dónde está la biblioteca? ¡Aquí mismo, señor!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός.",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！",
    "私はガラスを食べられます。それは私を傷つけません。カタカナとひらがな、漢字。",
    "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.",
    "أنا قادر على أكل الزجاج و هذا لا يؤلمني.",
    "אני יכול לאכול זכוכית וזה לא מזיק לי.",
    "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.",
    "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
    "Tôi có thể ăn thủy tinh mà không hại gì.",
    "Mogę jeść szkło i mi nie szkodzi. Żółć gęślą jaźń.",
    "Pot să mănânc sticlă și ea nu mă rănește.",
    "Cam yiyebilirim, bana zararı dokunmaz. İstanbul, ığdır, şişe.",
    "მინას ვჭამ და არა მტკივა.",
    "Կրնամ ապակի ուտել և ինծի անհանգիստ չըներ։",
    "ཤེལ་སྒོ་ཟ་ནས་ང་ན་གི་མ་རེད།",
    "ፊደል ኣብ ትግርኛ ቋንቋ ይጥቀሙ።",
    "Naïve café façade coöperate résumé jalapeño piñata",
    "ﬁnancial ﬂow ℌ𝔢𝔩𝔩𝔬 Ⅻ ① ㍻ ㎏ ｆｕｌｌｗｉｄｔｈ",
]

EMOJI_BASES = ["👍", "👋", "🧑", "👩", "👨", "🧒", "🙋", "🏃", "🤷", "💪", "🖐", "👶"]
SKIN_TONES = ["", "\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
ZWJ_SEQUENCES = [
    "👨\u200d👩\u200d👧\u200d👦", "👩\u200d💻", "🧑\u200d🚀", "🏳️\u200d🌈", "🏴\u200d☠️",
    "👩🏽\u200d🔬", "🧑🏿\u200d🤝\u200d🧑🏻", "❤️\u200d🔥", "🐕\u200d🦺", "👁️\u200d🗨️",
]
FLAGS = ["🇺🇸", "🇯🇵", "🇫🇷", "🇨🇳", "🇧🇷", "🇪🇺", "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"]
KEYCAPS = ["1\ufe0f\u20e3", "#\ufe0f\u20e3", "*\u20e3"]
MISC_EMOJI = ["😀", "😂", "🥲", "🤖", "🚀", "🔥", "✨", "🎉", "☕", "⚡", "✅", "❌", "™️", "©", "🫠", "🪿"]

DIGIT_SETS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９",
              "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗", "①②③④⑤", "ⅠⅡⅢⅣⅤ", "½¼¾²³"]

SPACES = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085",
          "\u2003", "\u200b", "\u180e", "\u000b", "\u000c", "\u202f", "\u205f", "\u1680"]

SPECIAL_TEXTS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁outputs▁begin｜>",
    "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁outputs▁end｜>",
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜▁pad▁｜>", "<｜place▁holder▁no▁7｜>",
    "<｜place▁holder▁no▁799｜>", "<think>", "</think>", "<｜User", "User｜>", "<｜", "｜>", "<|EOT|",
    "<｜begin▁of▁sentence｜", "<<｜User｜>>", "<｜Assistant｜><｜Assistant｜>",
]

CODE_SNIPPETS = [
    "def {name}(x, y=None):\n    \"\"\"Return the {name}.\"\"\"\n    if y is None:\n        return x ** 2\n    return [i for i in range(x) if i % y == 0]\n",
    "#include <vector>\nint {name}(const std::vector<int>& v) {{\n\tint s = 0;\n\tfor (auto x : v) s += x;\n\treturn s;  // sum\n}}\n",
    "function {name}(a, b) {{\n  const r = a?.b ?? [];\n  return r.map((x) => x * 2).filter(Boolean);\n}}\n",
    "fn {name}<'a>(s: &'a str) -> Option<&'a str> {{\n    s.split_whitespace().next()\n}}\n",
    "func {name}(ctx context.Context) error {{\n\tif err := run(ctx); err != nil {{\n\t\treturn fmt.Errorf(\"{name}: %w\", err)\n\t}}\n\treturn nil\n}}\n",
    "SELECT id, COUNT(*) AS n FROM {name} WHERE created_at >= '2024-01-01' GROUP BY id HAVING n > 10;\n",
    "<div class=\"{name}\"><a href=\"https://example.com/?q=1&amp;r=2\">link</a></div>\n",
    "{{\"{name}\": [1, 2.5e-3, true, null, {{\"k\": \"v\\u00e9\"}}]}}\n",
    "#!/bin/bash\nfor f in *.txt; do\n  grep -n \"{name}\" \"$f\" | awk -F: '{{print $1}}' >> out.log\ndone\n",
    "    \n\n\t\tclass {name}(Base):\n        pass\r\n\r\n",
    "x={name}[i+1]-=2**-3;y<<=4;z!=w&&q||!p; // ~^%$#@\n",
    "\\begin{{equation}} \\int_0^\\infty e^{{-x^2}} dx = \\frac{{\\sqrt{{\\pi}}}}{{2}} \\end{{equation}}",
]


def _chr_from(rng: random.Random, ranges) -> str:
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def _word(rng: random.Random, script: str) -> str:
    return "".join(_chr_from(rng, SCRIPTS[script]) for _ in range(rng.randint(1, 9)))


def _script_text(rng: random.Random) -> str:
    scripts = rng.sample(sorted(SCRIPTS), rng.randint(1, 3))
    parts = []
    for _ in range(rng.randint(1, 20)):
        parts.append(_word(rng, rng.choice(scripts)))
        parts.append(rng.choice([" ", " ", " ", ", ", ". ", "\n", "", "、", "。", "-", "'s "]))
    return "".join(parts)


def _vocab_prose(rng: random.Random, words: list[str]) -> str:
    out = []
    for _ in range(rng.randint(1, 40)):
        w = rng.choice(words)
        out.append(w)
        r = rng.random()
        if r < 0.05:
            out.append(rng.choice([".", ",", "!", "?", ";", ":", "\n", "\n\n", " -", "'"]))
    return "".join(out)


def _cjk_run(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        script = rng.choice(["cjk", "cjk", "hiragana", "katakana", "cjk_beyond", "halfwidth_kana"])
        parts.append("".join(_chr_from(rng, SCRIPTS[script]) for _ in range(rng.randint(1, 30))))
        parts.append(rng.choice(["", "", "，", "。", "「", "」", "ー", "・", " ", "1", "abc", "！", "\n"]))
    return "".join(parts)


def _emoji_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 15)):
        kind = rng.randint(0, 5)
        if kind == 0:
            parts.append(rng.choice(EMOJI_BASES) + rng.choice(SKIN_TONES))
        elif kind == 1:
            parts.append(rng.choice(ZWJ_SEQUENCES))
        elif kind == 2:
            parts.append(rng.choice(FLAGS))
        elif kind == 3:
            parts.append(rng.choice(KEYCAPS))
        else:
            parts.append(rng.choice(MISC_EMOJI) + rng.choice(["", "\ufe0f", "\ufe0e"]))
        parts.append(rng.choice(["", "", " ", "!", " hi ", "\n", "ok"]))
    return "".join(parts)


def _combining_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        base = rng.choice(["a", "e", "o", "n", "Z", "i", "ש", "к", "α", " ", "1", "ก", "の", "😀"])
        marks = "".join(chr(rng.choice([rng.randint(0x300, 0x36F), rng.randint(0x1AB0, 0x1ACE),
                                          rng.randint(0x20D0, 0x20F0), 0x5B4, 0x93C, 0xE48, 0x3099]))
                        for _ in range(rng.randint(0, 6)))
        parts.append(base + marks)
        if rng.random() < 0.3:
            parts.append(" ")
    return "".join(parts)


def _digit_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 8)):
        digits = rng.choice(DIGIT_SETS)
        parts.append("".join(rng.choice(digits) for _ in range(rng.randint(1, 40))))
        parts.append(rng.choice(["", " ", ".", ",", "-", "/", ":", "e", "x", "px", "%", "$", "年"]))
    return "".join(parts)


def _whitespace_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        run_len = rng.choice([1, 2, 3, 4, 7, 16, 33, 64, 200, 1000])
        pool = rng.sample(SPACES, rng.randint(1, 3))
        parts.append("".join(rng.choice(pool) for _ in range(run_len)))
        parts.append(rng.choice(["", "word", "x", "。", "!", "1", " a", "\tb", "😀"]))
    return "".join(parts)


def _code_text(rng: random.Random) -> str:
    names = ["foo", "bar_baz", "camelCase", "__init__", "x1", "données", "变量", "MAX_VALUE"]
    snippet = rng.choice(CODE_SNIPPETS).format(name=rng.choice(names))
    if rng.random() < 0.3:
        snippet = snippet.replace("    ", "\t")
    return snippet


def _special_text(rng: random.Random, words: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.4:
            parts.append(rng.choice(SPECIAL_TEXTS))
        elif r < 0.8:
            parts.append(rng.choice(words))
        else:
            parts.append(rng.choice([" ", "\n", "", "  ", "x", "。"]))
    return "".join(parts)


def _random_code_points(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(1, 40)):
        plane = rng.choice([0, 0, 0, 1, 1, 2, 3, 14, 15, 16])
        cp = rng.randint(plane * 0x10000, plane * 0x10000 + 0xFFFF)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        out.append(chr(cp))
        if rng.random() < 0.2:
            out.append(" ")
    return "".join(out)


def _invalid_utf8(rng: random.Random, words: list[str]) -> bytes:
    pieces = [
        b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
        b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3",
        b"\xe6\x88", b"\xf0\x9f", b"\xc3\x28", b"\xe2\x28\xa1", b"\xf8\x88\x80\x80\x80",
    ]
    out = bytearray()
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.35:
            out += rng.choice(pieces)
        elif r < 0.45:
            out += bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 6)))
        else:
            out += rng.choice(words).encode("utf-8")
    if rng.random() < 0.3:  # a truncated multi-byte character at the very end
        out += "界😀é".encode("utf-8")[: rng.choice([1, 2, 4, 5])]
    return bytes(out)


def _code_point_sweep() -> list[str]:
    """Every code point of planes 0, 1 and 14 (and a sample of plane 2), 256 per string, twice: contiguous, and each
    one between a space and a letter (or a letter and a space) (exercises every regex alternative's Unicode classes)."""
    out = []
    ranges = [(0, 0x30000), (0xE0000, 0xE0200)]
    for lo, hi in ranges:
        for start in range(lo, hi, 256):
            if 0x20000 <= start and start % 0x1000 != 0:  # plane 2 is CJK only: sample it
                continue
            cps = [c for c in range(start, min(start + 256, hi)) if not 0xD800 <= c <= 0xDFFF]
            if not cps:
                continue
            out.append("".join(chr(c) for c in cps))
            out.append("".join(" " + chr(c) + "a" for c in cps[::2]))
            out.append("".join("a" + chr(c) + " " for c in cps[1::2]))
    return out


def generate_corpus(vocab_words: list[str], seed: int = 20240801, random_count: int = 18500) -> list[bytes]:
    """`vocab_words`: decoded vocabulary entries (valid UTF-8 only), used as realistic words."""
    rng = random.Random(seed)
    corpus: list[bytes] = [s.encode() for s in SAMPLE_SENTENCES]
    corpus += [s.encode() for s in SPECIAL_TEXTS]
    corpus += [b"", b" ", b"\n", b"a", b"  hello", b"hello  ", b"\r\n\r\n", b"1234567890" * 5]
    generators = [
        (0.25, lambda: _vocab_prose(rng, vocab_words)),
        (0.12, lambda: _script_text(rng)),
        (0.08, lambda: _cjk_run(rng)),
        (0.07, lambda: _emoji_text(rng)),
        (0.07, lambda: _combining_text(rng)),
        (0.07, lambda: _digit_text(rng)),
        (0.06, lambda: _whitespace_text(rng)),
        (0.08, lambda: _code_text(rng)),
        (0.07, lambda: _special_text(rng, vocab_words)),
        (0.06, lambda: _random_code_points(rng)),
        (0.05, lambda: rng.choice(SAMPLE_SENTENCES) + _vocab_prose(rng, vocab_words)),
    ]
    weights = [w for w, _ in generators]
    for _ in range(random_count):
        make = rng.choices(generators, weights=weights)[0][1]
        corpus.append(make().encode("utf-8", "surrogatepass"))
    for _ in range(600):
        corpus.append(_invalid_utf8(rng, vocab_words))
    corpus += [s.encode("utf-8") for s in _code_point_sweep()]
    return corpus
