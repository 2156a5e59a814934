#!/usr/bin/env python3
"""Byte-level token files for model.gpt: text in, nanoGPT-format train.bin and val.bin out.

Every byte of the input files (concatenated in the order given) is one token, its id
the byte's value (0-255), so `model.gpt.vocab: 256` covers any text, in any language,
without a tokenizer. The ids are written as nanoGPT's prepare.py writes them: a flat
array of little-endian uint16 (or uint32, --dtype), nothing else in the file. The first
(1 - val_fraction) of the bytes go to train.bin, the rest to val.bin, as nanoGPT's
shakespeare_char splits its text.

    scripts/make_tokens.py --out data/gpl /usr/share/common-licenses/GPL-3
    # data/gpl/train.bin: 31,497 tokens, data/gpl/val.bin: 3,500 tokens

Standard library only: runs under any Python 3.
"""
import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", help="text (or any) files, read as bytes")
    p.add_argument("--out", required=True, help="directory for train.bin and val.bin")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="the last fraction of the bytes that goes to val.bin (default 0.1; "
                        "0: no val.bin)")
    p.add_argument("--dtype", choices=["uint16", "uint32"], default="uint16",
                   help="width of each id in the files (data.tokens.dtype; default uint16)")
    args = p.parse_args(argv)
    if not 0 <= args.val_fraction < 1:
        p.error(f"--val-fraction must be in [0, 1) (got {args.val_fraction})")
    return args


def write_ids(path, data, dtype):
    """Each byte of `data` as one little-endian id of `dtype`'s width: the byte itself,
    then zero bytes."""
    width = 2 if dtype == "uint16" else 4
    ids = bytearray(len(data) * width)
    ids[0::width] = data
    with open(path, "wb") as f:
        f.write(ids)
    return len(data)


def main(argv=None):
    args = parse_args(argv)
    data = bytearray()
    for path in args.inputs:
        with open(path, "rb") as f:
            data += f.read()
    n_val = int(len(data) * args.val_fraction)
    train, val = data[:len(data) - n_val], data[len(data) - n_val:]
    os.makedirs(args.out, exist_ok=True)
    n = write_ids(os.path.join(args.out, "train.bin"), train, args.dtype)
    print(f"{os.path.join(args.out, 'train.bin')}: {n:,} tokens ({args.dtype})")
    if n_val > 0:
        n = write_ids(os.path.join(args.out, "val.bin"), val, args.dtype)
        print(f"{os.path.join(args.out, 'val.bin')}: {n:,} tokens ({args.dtype})")


if __name__ == "__main__":
    main()
