#!/usr/bin/env python3
"""Cross-checks deepinfer's safetensors reader and writer against the reference Python
`safetensors` package, in both directions, plus a differential test on mutated files.

Usage: safetensors_crosscheck.py TOOL   (TOOL = the safetensors_tool test helper)
Exits 77 (CTest: skipped) when the safetensors package is not installed.
"""
import ctypes
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

try:
    import safetensors
    from safetensors import deserialize, serialize, serialize_file
except ImportError:
    print("safetensors is not installed; skipping (pip install -r requirements-test.txt)")
    sys.exit(77)

TOOL = sys.argv[1]

# safetensors dtype name -> (bits per element, the name the Python serializer takes)
DTYPES = {
    "F32": (32, "float32"),
    "BF16": (16, "bfloat16"),
    "F16": (16, "float16"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "F4": (4, "float4_e2m1fn_x2"),
    "I8": (8, "int8"),
    "I32": (32, "int32"),
    "I64": (64, "int64"),
    "BOOL": (8, "bool"),
}

_keep_alive = []


def python_serialize(tensors, metadata, path=None):
    """Serializes with the reference library. tensors: list of (name, dtype, shape, bytes)."""
    flat = {}
    for name, dtype, shape, data in tensors:
        torch_name = DTYPES[dtype][1]
        # The library takes fp4 in PyTorch's float4_e2m1fn_x2 convention: the last dimension
        # counts bytes (pairs); it writes "F4" with the logical shape.
        spec_shape = list(shape)
        if dtype == "F4":
            spec_shape[-1] //= 2
        if hasattr(safetensors, "TensorSpec"):
            buffer = ctypes.create_string_buffer(bytes(data), max(1, len(data)))
            _keep_alive.append(buffer)
            flat[name] = safetensors.TensorSpec(
                dtype=torch_name, shape=spec_shape, data_ptr=ctypes.addressof(buffer), data_len=len(data))
        else:
            flat[name] = {"dtype": torch_name, "shape": spec_shape, "data": bytes(data)}
    if path is None:
        return bytes(serialize(flat, metadata))
    serialize_file(flat, path, metadata)
    return None


def python_read(image):
    return {name: (view["dtype"], list(view["shape"]), bytes(view["data"])) for name, view in deserialize(image)}


def tool_dump(path):
    result = subprocess.run([TOOL, "dump", path], capture_output=True, text=True, check=False)
    if result.returncode not in (0, 1) or not result.stdout:
        raise SystemExit(f"tool crashed on {path}: rc={result.returncode} stderr={result.stderr}")
    out = json.loads(result.stdout)
    if "error" in out:
        return None, out["error"]
    tensors = {t["name"]: (t["dtype"], t["shape"], bytes.fromhex(t["hex"])) for t in out["tensors"]}
    return (tensors, out["metadata"]), None


def tool_write(args, tensors, metadata):
    spec = {"metadata": metadata or {},
            "tensors": [{"name": n, "dtype": d, "shape": s, "hex": bytes(b).hex()} for n, d, s, b in tensors]}
    subprocess.run([TOOL] + args, input=json.dumps(spec), text=True, check=True)


def random_tensors(rng, count):
    names = set()
    tensors = []
    while len(tensors) < count:
        name = rng.choice(["layers.%d.w" % rng.randrange(40), "norm", "é.ü", "a\"b", "x\ny", "tab\t", "emb_%d" % rng.randrange(9)])
        if name in names:
            continue
        names.add(name)
        dtype = rng.choice(sorted(DTYPES))
        shape = [rng.randrange(0, 5) for _ in range(rng.randrange(0, 4))]
        if dtype == "F4":
            shape = (shape or [1])[:-1] + [2 * rng.randrange(0, 4)]
        elements = 1
        for extent in shape:
            elements *= extent
        data = bytes(rng.randrange(256) for _ in range(elements * DTYPES[dtype][0] // 8))
        tensors.append((name, dtype, shape, data))
    return tensors


def expect_equal(label, ours, theirs):
    if ours != theirs:
        raise SystemExit(f"MISMATCH {label}:\n ours   {ours!r}\n theirs {theirs!r}")


def main():
    rng = random.Random(4242)
    checks = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in range(40):
            tensors = random_tensors(rng, rng.randrange(0, 8))
            metadata = rng.choice([None, {"format": "pt"}, {"a": "1", "é": "\"q\"", "k": ""}])
            expected = {n: (d, s, b) for n, d, s, b in tensors}

            # Python writes, we read.
            path = os.path.join(tmp, f"py_{case}.safetensors")
            python_serialize(tensors, metadata, path)
            parsed, error = tool_dump(path)
            if error:
                raise SystemExit(f"deepinfer refused a file the reference library wrote: {error}")
            expect_equal(f"case {case}: tensors read from the Python file", parsed[0], expected)
            expect_equal(f"case {case}: metadata", parsed[1], metadata or {})

            # We write, Python reads; with at most one metadata key (the reference library
            # orders several keys randomly) the files must be byte-identical.
            ours = os.path.join(tmp, f"cpp_{case}.safetensors")
            tool_write(["write", ours], tensors, metadata)
            with open(ours, "rb") as f:
                image = f.read()
            expect_equal(f"case {case}: tensors Python reads from our file", python_read(image), expected)
            (header_len,) = struct.unpack("<Q", image[:8])
            header = json.loads(image[8:8 + header_len])
            expect_equal(f"case {case}: metadata Python reads", header.get("__metadata__"), metadata)
            if metadata is None or len(metadata) <= 1:
                expect_equal(f"case {case}: bytes", image, python_serialize(tensors, metadata))
            checks += 3

            # Sharded: we write, Python reads every shard through the index.
            shard_dir = os.path.join(tmp, f"sharded_{case}")
            tool_write(["write-sharded", shard_dir, str(rng.choice([1, 16, 64, 1 << 20]))], tensors, metadata)
            index_path = os.path.join(shard_dir, "model.safetensors.index.json")
            seen = {}
            if os.path.exists(index_path):
                with open(index_path) as f:
                    index = json.load(f)
                for shard in sorted(set(index["weight_map"].values())):
                    with open(os.path.join(shard_dir, shard), "rb") as f:
                        for name, value in python_read(f.read()).items():
                            expect_equal(f"case {case}: shard of {name}", index["weight_map"][name], shard)
                            seen[name] = value
                expect_equal(f"case {case}: total_size", index["metadata"]["total_size"],
                             sum(len(b) for _, _, _, b in tensors))
            else:
                with open(os.path.join(shard_dir, "model.safetensors"), "rb") as f:
                    seen = python_read(f.read())
            expect_equal(f"case {case}: sharded tensors", seen, expected)
            checks += 1

        # Differential: mutants of reference-written files. Whatever we accept, the reference
        # library must accept with the same contents (we are at least as strict); whatever it
        # refuses, we refuse.
        accepted = refused_both = stricter = 0
        seeds = []
        for _ in range(8):
            seeds.append(python_serialize(random_tensors(rng, rng.randrange(1, 6)), rng.choice([None, {"format": "pt"}])))
        for trial in range(600):
            image = bytearray(rng.choice(seeds))
            (header_len,) = struct.unpack("<Q", image[:8])
            kind = rng.randrange(5)
            if kind == 0:
                image[rng.randrange(len(image))] ^= 1 << rng.randrange(8)
            elif kind == 1:
                del image[rng.randrange(len(image)):]
            elif kind == 2:
                image += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
            elif kind == 3:  # change a digit of the header, keeping its length
                digits = [i for i in range(8, 8 + header_len) if chr(image[i]).isdigit()]
                image[rng.choice(digits)] = ord(str(rng.randrange(10)))
            else:  # change a byte of the header
                image[8 + rng.randrange(header_len)] = rng.randrange(32, 127)
            path = os.path.join(tmp, "mutant.safetensors")
            with open(path, "wb") as f:
                f.write(image)
            ours, _ = tool_dump(path)
            try:
                theirs = python_read(bytes(image))
            except Exception:  # noqa: BLE001 - any refusal of the reference library
                theirs = None
            if ours is not None:
                if theirs is None:
                    raise SystemExit(f"mutant {trial}: deepinfer accepted what the reference refuses: {bytes(image)[:300]!r}")
                expect_equal(f"mutant {trial}", ours[0], theirs)
                accepted += 1
            elif theirs is None:
                refused_both += 1
            else:
                stricter += 1  # e.g. a repeated key, which the reference library resolves silently
        checks += 600
    print(f"crosscheck ok: {checks} checks; mutants accepted by both {accepted}, refused by both "
          f"{refused_both}, refused only by deepinfer {stricter}; safetensors {safetensors.__version__}")


if __name__ == "__main__":
    main()
