"""GPT-2 as nanoGPT's model.py writes it: the PyTorch reference for ddp-trainer's `model.gpt`.

The architecture, the parameter names and the initialization (and so the random draws, in
their order) are nanoGPT's (github.com/karpathy/nanoGPT, model.py), with two changes the
job file's `model.gpt` asks for:
  - GELU is the tanh approximation (GPT-2's own, and llm.c's), nanoGPT's is the exact one;
  - `tie_weights` may be False: the head then has its own weight (nanoGPT always ties).
Attention is F.scaled_dot_product_attention(is_causal=True) where PyTorch has it (2.x) and
nanoGPT's masked softmax otherwise (1.13), as nanoGPT chooses; `attention=` forces one.

Used by the parity tests (tests/trainer/) and the GPU bench (bench/gpu/), under PyTorch 1.13
and 2.x alike. Build it after torch.manual_seed(seed), on the CPU, as ddp-trainer does.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024   # model.gpt.seq_len
    vocab_size: int = 50304  # model.gpt.vocab
    n_layer: int = 12        # model.gpt.layers
    n_head: int = 12         # model.gpt.heads
    n_embd: int = 768        # model.gpt.dim
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    attention: str = "auto"  # auto | sdpa | manual


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        has_sdpa = hasattr(F, "scaled_dot_product_attention")
        if config.attention == "sdpa" and not has_sdpa:
            raise RuntimeError(f"torch {torch.__version__} has no scaled_dot_product_attention")
        self.flash = has_sdpa if config.attention == "auto" else config.attention == "sdpa"
        if not self.flash:
            # Not a registered buffer (nanoGPT's is): state dicts hold parameters only, as
            # ddp-trainer's checkpoints do.
            self.mask = torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = self.mask.to(att.device)
            att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # https://paperswithcode.com/method/weight-tying
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections.
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of {t} > block size {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    def param_groups(self, weight_decay, decay="matrices"):
        """nanoGPT's configure_optimizers groups: every parameter of 2 or more dimensions
        (matmul weights, embeddings) decays, biases and LayerNorm weights do not.
        decay="all": one group, every parameter decays."""
        params = [p for p in self.parameters() if p.requires_grad]
        if decay == "all":
            return [{"params": params, "weight_decay": weight_decay}]
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def flops_per_token(config, n_params):
    """The design's MFU numerator: 6 N + 12 layers dim seq_len FLOPs per token trained."""
    return 6 * n_params + 12 * config.n_layer * config.n_embd * config.block_size
