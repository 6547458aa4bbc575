#!/usr/bin/env python3
"""Oracle for the tokenizer tests: runs HF `tokenizers` (PyPI) on the corpus and writes the
expected ids, every token's bytes and the engram compressed-vocabulary map into one compact
tar.xz that tests/tokenizer extracts at configure time.

    python3 scripts/tokenizer/make_expected.py \
        --tokenizer ../shared/data/tokenizers/deepseek_v3 \
        --out tests/data/tokenizer/deepseek_v3_expected.tar.xz

Invalid UTF-8 policy (same as deepinfer's): a byte string is first repaired with
bytes.decode("utf-8", "replace") — each maximal invalid subpart becomes U+FFFD — and the
repaired text is encoded.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time

from tokenizers import Regex, Tokenizer, normalizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import generate_corpus  # noqa: E402


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """The byte -> character table of OpenAI's GPT-2 encoder.py, written from its definition."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def token_bytes_table(tok: Tokenizer, size: int) -> list[str]:
    """Hex of the bytes each id decodes to; checked against HF's own decode of the id."""
    char_to_byte = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    table = []
    for token_id in range(size):
        spelling = tok.id_to_token(token_id)
        if spelling is None:
            raw = b""
        elif all(c in char_to_byte for c in spelling):
            raw = bytes(char_to_byte[c] for c in spelling)
        else:  # HF's ByteLevel decoder keeps a token with any non-byte character as UTF-8
            raw = spelling.encode("utf-8")
        decoded = tok.decode([token_id], skip_special_tokens=False)
        assert raw.decode("utf-8", "replace") == decoded, (token_id, spelling, decoded)
        table.append(raw.hex())
    return table


def build_compressed_token_map(backend: Tokenizer, size: int) -> tuple[list[int], int]:
    """HF transformers models/deepseek_v41 build_compressed_token_map, step for step, on the
    backend (Rust) tokenizer; `size` is len(tokenizer)."""
    sentinel = "\ue000"
    normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), sentinel),
            normalizers.Strip(),
            normalizers.Replace(sentinel, " "),
        ]
    )
    key_to_new: dict[str, int] = {}
    lookup = [0] * size
    for token_id in range(size):
        text = backend.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = backend.id_to_token(token_id)
        else:
            normalized = normalizer.normalize_str(text)
            key = normalized or text
        new_id = key_to_new.get(key)
        if new_id is None:
            new_id = len(key_to_new)
            key_to_new[key] = new_id
        lookup[token_id] = new_id
    return lookup, len(key_to_new)


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="directory with tokenizer.json")
    parser.add_argument("--out", required=True, help="output .tar.xz")
    args = parser.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    size = tok.get_vocab_size(with_added_tokens=True)
    t0 = time.time()
    words = []
    for token_id in range(size):
        text = tok.decode([token_id])
        if text and "\ufffd" not in text:
            words.append(text)
    corpus = generate_corpus(words)
    texts = [b.decode("utf-8", "replace") for b in corpus]
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    lines = []
    for raw, text, enc in zip(corpus, texts, encodings):
        entry = {"t": text} if text.encode("utf-8") == raw else {"x": raw.hex()}
        entry["ids"] = enc.ids
        lines.append(json.dumps(entry, ensure_ascii=False))
    print(f"corpus: {len(corpus)} strings, {sum(len(b) for b in corpus) / 1e6:.1f} MB, "
          f"{sum(len(e.ids) for e in encodings)} ids ({time.time() - t0:.1f}s)")

    table = token_bytes_table(tok, size)
    lookup, compressed = build_compressed_token_map(tok, size)
    print(f"vocab: {size} ids, compressed vocab {compressed}")

    with tarfile.open(args.out, "w:xz", preset=9) as tar:
        add_member(tar, "corpus.jsonl", ("\n".join(lines) + "\n").encode("utf-8"))
        add_member(tar, "token_bytes.json", json.dumps(table).encode())
        add_member(tar, "engram_map.json",
                   json.dumps({"compressed_vocab": compressed, "map": lookup}).encode())
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
