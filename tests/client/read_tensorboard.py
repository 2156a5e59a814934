#!/usr/bin/env python3
"""Reads a TensorBoard run with TensorBoard's own reader and prints it as JSON.

    read_tensorboard.py RUN_DIR

Prints {"scalars": {tag: [[step, value, wall_time], ...]}, "texts": {tag: [[step,
text], ...]}} from tensorboard.backend.event_processing.EventAccumulator (every point
kept: size_guidance 0), the reader TensorBoard's own server is built on. Run it with
an interpreter that has PyPI's `tensorboard` (scripts/install_test_tools.sh).
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    acc = event_accumulator.EventAccumulator(
        sys.argv[1],
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0},
    )
    acc.Reload()
    tags = acc.Tags()
    out = {"scalars": {}, "texts": {}}
    for tag in tags["scalars"]:
        out["scalars"][tag] = [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)]
    for tag in tags["tensors"]:
        texts = []
        for e in acc.Tensors(tag):
            # A text summary is a string tensor: string_val holds the text.
            texts.append([e.step, e.tensor_proto.string_val[0].decode("utf-8")])
        out["texts"][tag] = texts
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
