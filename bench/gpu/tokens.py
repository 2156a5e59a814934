"""Token files for the GPT bench, made without a network: byte-level text as token ids.

    python3 bench/gpu/tokens.py --out DIR --tokens N [--llmc]

writes DIR/train.bin: N token ids, little-endian uint16 with no header (nanoGPT's
prepare.py format, what ddp-trainer's `data.tokens` and bench/gpu/gpt_pytorch.py read),
each the byte of a text (ids below 256, within any vocabulary from 256 up: for throughput,
not for language modelling). The text is the repository's docs/*.md and README.md, then
/usr/share/common-licenses/* where present, repeated to length, so every machine that has
the working tree writes the same file. --llmc also writes DIR/train_llmc.bin, the same
tokens in llm.c's format (llmc/dataloader.h: a header of 256 int32, magic 20240520,
version 1, the token count, then the uint16 ids), for llm.c's train_gpt2cu.

`llmc_from_bin(src, dst)` converts any nanoGPT-format uint16 file to llm.c's.
"""
import argparse
import glob
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256


def source_text():
    paths = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    paths += [os.path.join(ROOT, "README.md")]
    paths += sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p))
    data = b"".join(open(p, "rb").read() for p in paths if os.path.isfile(p))
    if not data:
        raise SystemExit("tokens.py: no text found (docs/*.md, README.md, /usr/share/common-licenses)")
    return data


def write_bin(path, n):
    """n byte-level token ids as little-endian uint16 (nanoGPT's format)."""
    text = source_text()
    reps = -(-n // len(text))
    ids = (text * reps)[:n]
    # Each byte b becomes the uint16 b: interleave with zero high bytes (little-endian).
    out = bytearray(2 * n)
    out[0::2] = ids
    with open(path, "wb") as f:
        f.write(out)
    return n


def llmc_from_bin(src, dst):
    """llm.c's token file (llmc/dataloader.h) holding src's uint16 ids."""
    size = os.path.getsize(src)
    if size % 2:
        raise SystemExit(f"tokens.py: {src}: {size} bytes is not a whole number of uint16 ids")
    n = size // 2
    if n >= 2 ** 31:
        raise SystemExit(f"tokens.py: {src}: {n} tokens do not fit llm.c's int32 count")
    header = [0] * LLMC_HEADER_INTS
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, n
    with open(dst, "wb") as f:
        f.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        with open(src, "rb") as s:
            f.write(s.read())
    return n


def check_llmc(path):
    """The checks llm.c's dataloader makes: magic, version, count > 0, the file's size."""
    with open(path, "rb") as f:
        header = struct.unpack(f"<{LLMC_HEADER_INTS}i", f.read(4 * LLMC_HEADER_INTS))
    size = os.path.getsize(path)
    problems = []
    if header[0] != LLMC_MAGIC:
        problems.append(f"magic {header[0]}, not {LLMC_MAGIC}")
    if header[1] != LLMC_VERSION:
        problems.append(f"version {header[1]}, not {LLMC_VERSION}")
    if header[2] <= 0:
        problems.append(f"token count {header[2]}")
    if size != 4 * LLMC_HEADER_INTS + 2 * header[2]:
        problems.append(f"{size} bytes, not {4 * LLMC_HEADER_INTS} + 2 x {header[2]}")
    if problems:
        raise SystemExit(f"tokens.py: {path}: " + "; ".join(problems))
    return header[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--llmc", action="store_true", help="also DIR/train_llmc.bin (llm.c's format)")
    a = ap.parse_args()
    if a.tokens < 2:
        raise SystemExit("tokens.py: --tokens must be at least 2")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "train.bin")
    write_bin(path, a.tokens)
    print(f"{path}: {a.tokens:,} byte-level tokens (uint16)")
    if a.llmc:
        llmc = os.path.join(a.out, "train_llmc.bin")
        llmc_from_bin(path, llmc)
        print(f"{llmc}: {check_llmc(llmc):,} tokens in llm.c's format")
    return 0


if __name__ == "__main__":
    sys.exit(main())
