"""PyTorch's side of trainer_gpt_test: nanoGPT's GPT (tests/reference/nanogpt.py) and
torch.utils.data's DistributedSampler over token windows, written with torch.save for
the C++ test to compare with ddp-trainer's (torch::pickle_load reads the files).

    init        the model after torch.manual_seed(seed): named_parameters() names and
                tensors, state_dict() names, the eval-mode logits of a fixed input, and
                the generator's next draws
    windows     every rank's windows, epoch by epoch, as DistributedSampler and DataLoader
                give them over scripts/pytorch_ddp_reference.py's TokenWindows
    checkpoint  a ddp-trainer checkpoint's model loaded into the GPT with
                load_state_dict(strict=True), then its per-token loss and accuracy on a
                token file, as JSON on stdout

Run by the flavour's Python (torch 1.13 or 2.x), one thread.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import nanogpt  # noqa: E402
from pytorch_ddp_reference import TokenWindows  # noqa: E402


def config(args):
    return nanogpt.GPTConfig(block_size=args.seq_len, vocab_size=args.vocab, n_layer=args.layers,
                             n_head=args.heads, n_embd=args.dim, dropout=0.0,
                             tie_weights=not args.untied)


def init(args):
    torch.manual_seed(args.seed)
    model = nanogpt.GPT(config(args))
    after = torch.rand(8)  # Where construction left the generator.
    model.eval()
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, args.vocab, (3, args.seq_len), generator=gen)
    with torch.no_grad():
        logits, _ = model(idx)
    named = list(model.named_parameters())
    torch.save({"names": [n for n, _ in named],
                "params": {n: p.detach().clone() for n, p in named},
                "state_names": list(model.state_dict().keys()),
                "input": idx, "logits": logits, "after": after,
                "torch": str(torch.__version__)}, args.out)


def windows(args):
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    data = TokenWindows(args.tokens, "uint16", args.seq_len)
    out = {"windows": len(data)}
    for world in args.worlds:
        for rank in range(world):
            sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                         seed=args.seed, drop_last=False)
            loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
            for epoch in range(args.epochs):
                sampler.set_epoch(epoch)
                key = f"w{world}r{rank}e{epoch}"
                out[key + "_indices"] = torch.tensor(list(iter(sampler)))
                xs, ys = zip(*loader)
                out[key + "_x"] = torch.cat(xs)
                out[key + "_y"] = torch.cat(ys)
    torch.save(out, args.out)


def checkpoint(args):
    # weights_only=False: the file holds LibTorch's typed dicts, which PyTorch 2.6's
    # default (weights_only=True) refuses; the file is the test's own.
    state = torch.load(args.checkpoint, weights_only=False)["model"]
    model = nanogpt.GPT(config(args))
    model.load_state_dict(state, strict=True)
    model.eval()
    data = TokenWindows(args.tokens, "uint16", args.seq_len)
    loss_sum, correct, tokens = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(data), args.batch):
            x, y = [torch.stack(t) for t in zip(*(data[j] for j in range(i, min(len(data), i + args.batch))))]
            logits, _ = model(x)
            loss_sum += torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
            correct += logits.argmax(-1).eq(y).sum().item()
            tokens += y.numel()
    print(json.dumps({"keys": list(state.keys()),
                      "tied": model.lm_head.weight is model.transformer.wte.weight,
                      "val_loss": loss_sum / tokens, "val_accuracy": correct / tokens}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["init", "windows", "checkpoint"])
    p.add_argument("--out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--untied", action="store_true")
    p.add_argument("--tokens")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--worlds", type=int, nargs="*", default=[2, 3])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--checkpoint")
    args = p.parse_args()
    torch.set_num_threads(1)
    {"init": init, "windows": windows, "checkpoint": checkpoint}[args.command](args)


if __name__ == "__main__":
    main()
