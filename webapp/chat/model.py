"""A GPT in nanoGPT's parameter layout, with a preallocated KV cache for decoding.

Parameter names match nanoGPT (and so the owner's checkpoints):
    transformer.wte, transformer.wpe, transformer.h.N.{ln_1, attn.c_attn, attn.c_proj,
    ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f, lm_head (weight tied to wte).

Two ways to run it:
    model(idx, targets=None) -> (logits, loss)       the seed's contract (training, full recompute)
    model.forward_cached(idx, cache, start_pos)       incremental decoding with a KVCache

Shapes: B batch, T time (tokens), C n_embd, nh n_head, hs head size (C // nh), V vocab_size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 (room for chat specials)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    bias: bool = True  # biases in Linear and LayerNorm layers, as GPT-2


# Named architectures; `arch` in the loader and the owner's build_model(arch) use these names.
PRESETS: dict[str, GPTConfig] = {
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2-254m": GPTConfig(n_layer=16, n_head=16, n_embd=1024),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}


class KVCache:
    """Keys and values of every layer, preallocated for `max_len` positions.

    k, v: one (B, nh, max_len, hs) tensor per layer. Separate tensors, not slices of one: under
    torch.compile a write into a slice of a shared tensor copied the whole cache every step.
    The batch dimension is there so several sequences can share one decoding step later; today
    every row shares the same start_pos.
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device, dtype):
        hs = config.n_embd // config.n_head
        shape = (batch, config.n_head, max_len, hs)
        # empty, not zeros: only positions already written are ever read
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.max_len = max_len
        self.batch = batch


class Linear(nn.Linear):
    """nn.Linear (same parameters, same names) that runs a single row as a matrix-vector product.

    Decoding one token is a chain of matrix-vector products, bound by reading the weights. On CPU,
    torch's addmv reads bf16 weights ~30% faster than the addmm that nn.Linear uses (measured in
    docs/benchmarks.md); for fp32 they are alike. Several rows (prefill, training) stay a matmul.
    """

    def forward(self, x):
        # more than one row; or under torch.compile, which would turn addmv into a slow generated loop
        if x.numel() != x.size(-1) or torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        row = x.reshape(-1)  # (C,)
        y = torch.mv(self.weight, row) if self.bias is None else torch.addmv(self.bias, self.weight, row)
        return y.view(*x.shape[:-1], -1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v at once
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x, cache: KVCache | None = None, layer: int = 0, start_pos: int = 0):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            end = start_pos + T
            cache.k[layer][:B, :, start_pos:end] = k
            cache.v[layer][:B, :, start_pos:end] = v
            k = cache.k[layer][:B, :, :end]  # (B, nh, end, hs): everything seen so far
            v = cache.v[layer][:B, :, :end]
            if T == 1:
                # one new token may look at every cached position: no mask needed
                y = F.scaled_dot_product_attention(q, k, v)
            elif start_pos == 0:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # a later prefill chunk: query i sits at position start_pos + i. SDPA's is_causal
                # aligns the mask top-left, which is wrong when T != end, so spell it out.
                mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start_pos)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache: KVCache | None = None, layer: int = 0, start_pos: int = 0):
        x = x + self.attn(self.ln_1(x), cache, layer, start_pos)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as GPT-2

        # GPT-2 init; residual projections scaled down by depth (GPT-2 paper, section 2.3)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameters counted once (wte and lm_head share one tensor)."""
        return sum(p.numel() for p in self.parameters())

    def _embed(self, idx, start_pos: int):
        B, T = idx.size()
        if start_pos + T > self.config.block_size:
            raise ValueError(f"positions {start_pos}..{start_pos + T - 1} exceed block_size {self.config.block_size}")
        pos = torch.arange(start_pos, start_pos + T, dtype=torch.long, device=idx.device)  # (T,)
        return self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> (logits, loss).

        With targets (B, T) (-1 = ignore), logits are (B, T, V) and loss is the mean cross-entropy.
        Without targets, as nanoGPT does, only the last position is projected: logits are (B, 1, V)
        and loss is None. Callers take logits[:, -1, :] either way.
        """
        x = self._embed(idx, 0)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None  # (B, 1, V)
        logits = self.lm_head(x)  # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """An empty KV cache on the model's device and dtype, for up to block_size positions."""
        p = self.lm_head.weight
        return KVCache(self.config, batch, max_len or self.config.block_size, p.device, p.dtype)

    def forward_cached(self, idx, cache: KVCache, start_pos: int, logits: bool = True):
        """Run tokens idx (B, T) at positions start_pos.. start_pos+T-1, storing their keys and values
        in `cache`, and return the logits of the last position, (B, V) (None with logits=False: a
        prefill chunk before the last needs only its keys and values, not a pass over lm_head).

        Positions before start_pos must already be in the cache. Prefill a prompt with start_pos=0
        (whole or in chunks), then feed one token at a time with start_pos = tokens so far.
        """
        if start_pos + idx.size(1) > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions; asked for {start_pos + idx.size(1)}")
        if idx.size(1) == 1 and logits and self.compiled_step is not None:
            return self.compiled_step(idx, cache, start_pos)
        return self._forward_cached(idx, cache, start_pos, logits)

    compiled_step = None  # set by compile_decoding()

    def _forward_cached(self, idx, cache: KVCache, start_pos: int, logits: bool = True):
        x = self._embed(idx, start_pos)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache, layer, start_pos)
        if not logits:
            return None
        x = self.transformer.ln_f(x[:, -1, :])  # (B, C): only the last position is needed
        return self.lm_head(x)  # (B, V)


def compile_decoding(model: GPT) -> GPT:
    """torch.compile the one-token decode step (GLASSBOX_COMPILE=1). Prefill chunks stay eager: they are
    large matrix products that compiling barely helps. dynamic=True: one graph for every position,
    instead of one per cache length. The first decode step compiles (tens of seconds on a CPU)."""
    model.compiled_step = torch.compile(model._forward_cached, dynamic=True)
    return model
