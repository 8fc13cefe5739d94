"""A GPT in nanoGPT's parameter layout, with a preallocated KV cache for decoding.

Parameter names match nanoGPT (and so the owner's checkpoints):
    transformer.wte, transformer.wpe, transformer.h.N.{ln_1, attn.c_attn, attn.c_proj,
    ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f, lm_head (weight tied to wte).

Two ways to run it:
    model(idx, targets=None) -> (logits, loss)       the seed's contract (training, full recompute)
    model.forward_cached(idx, cache, start_pos)       prefill one sequence's KVCache (in chunks)
    model.decode_step(idx, caches, positions)         one token for each of several sequences

Shapes: B batch, T time (tokens), C n_embd, nh n_head, hs head size (C // nh), V vocab_size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from webapp.chat.model import kernels


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
    One cache holds one sequence (batch 1): sequences decoded together each keep their own, so
    each can be kept for its conversation's next turn (webapp/chat/decode/prefix_cache.py).
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device, dtype):
        hs = config.n_embd // config.n_head
        shape = (batch, config.n_head, max_len, hs)
        # empty, not zeros: only positions already written are ever read
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.max_len = max_len
        self.batch = batch
        self.config = config
        self.nbytes = 2 * config.n_layer * math.prod(shape) * torch.empty((), dtype=dtype).element_size()

    def copy(self, max_len: int, positions: int) -> KVCache:
        """A new cache of max_len positions holding this one's first `positions` keys and values."""
        k0 = self.k[0]
        out = KVCache(self.config, self.batch, max_len, k0.device, k0.dtype)
        for mine, theirs in zip(self.k + self.v, out.k + out.v):
            theirs[:, :, :positions] = mine[:, :, :positions]
        return out


class DecodingLinear:
    """forward() of Glassbox's linear layers (Linear, precision.WeightOnlyLinear): x @ Wᵀ + b (matmul()),
    or, with decode=True, a decode step's layer together with what surrounds it in a block:
        gelu(norm(x) @ Wᵀ + b) + residual, each part only when given.
    Glassbox's kernel does a decode step's layer in one call (webapp/chat/model/kernels; a step is short: a
    call per small operator would cost as much as the layer norms themselves); without the kernel,
    torch's operators compute the same thing one by one."""

    weight: torch.Tensor  # (out, in)
    bias: Any  # (out,) or None
    scale: torch.Tensor | None  # one per output row, for int8 weights
    matmul: Callable[[torch.Tensor], torch.Tensor]

    def forward(self, x, decode: bool = False, norm=None, gelu: bool = False, residual=None):
        if not decode:
            return self.matmul(x)
        if kernels.supports(x, self.weight):
            return kernels.linear(x, self.weight, self.bias, self.scale, norm, gelu, residual)
        y = self.matmul(x if norm is None else norm(x))
        if gelu:
            y = F.gelu(y)
        return y if residual is None else residual + y


class Linear(DecodingLinear, nn.Linear):
    """nn.Linear (same parameters, same names) whose CPU inference gives every row the same result
    whatever else is in the batch.

    Batched decoding must not change a reply (docs/architecture.md, "The same reply as alone"). A
    decode step (decode=True) runs Glassbox's own kernel (webapp/chat/model/kernels): each output summed in
    one fixed order, and the weights streamed at the machine's bandwidth for a single row. Prefill, and
    decoding where that kernel cannot be compiled, run oneDNN's inner product: for two or more rows it
    computes each row with the same reduction order, bit for bit, whatever the number of rows; a single
    row takes a matrix-vector path whose sums are ordered differently, so one row is run as two.
    Training, autograd, other devices and float16 keep F.linear.
    """

    scale = None  # WeightOnlyLinear's int8 weights have one per output row; float weights none

    def matmul(self, x):
        if not _batch_invariant(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return onednn_linear(x, self.weight, self.bias)


def onednn_linear(x, weight, bias):
    """x @ weightᵀ + bias through oneDNN's inner product, one row run as two (see Linear)."""
    rows = x.reshape(-1, x.size(-1))  # (N, C_in)
    n = rows.size(0)
    if n == 1:
        rows = rows.expand(2, -1)
    if rows.dtype == torch.bfloat16 and not _onednn_bfloat16():
        # a CPU without bfloat16 inner products (AVX2 only): the same weights widened exactly to float32,
        # whose inner product computes each row alike too; the result rounded back to bfloat16
        y = torch.ops.mkldnn._linear_pointwise(rows.float().contiguous(), weight.float(),
                                               None if bias is None else bias.float(), "none", [], "")
        y = y.to(torch.bfloat16)
    else:
        y = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), weight, bias, "none", [], "")
    return y[:n].view(*x.shape[:-1], -1)


_ONEDNN = torch.backends.mkldnn.is_available()


@functools.cache
def _onednn_bfloat16() -> bool:
    """Whether oneDNN has a bfloat16 inner product on this CPU (it refuses to create one without AVX-512)."""
    try:
        ones = torch.ones(2, 16, dtype=torch.bfloat16)
        torch.ops.mkldnn._linear_pointwise(ones, ones, None, "none", [], "")
    except RuntimeError:
        return False
    return True


def _batch_invariant(x, weight) -> bool:
    """Whether x @ weight.T may take the batch-invariant oneDNN path."""
    return (_ONEDNN and x.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and x.dtype == weight.dtype and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling())


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v at once
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x, cache: KVCache | None = None, layer: int = 0, start_pos: int = 0):
        return self.c_proj(self._attend(self.c_attn(x), cache, layer, start_pos))

    def prefill_many(self, x, segments: list[tuple[KVCache, int, int]], layer: int):
        """attention(x) for several sequences' prefill chunks side by side in x (1, ΣT, C): segment i is
        (its cache, its start position, its T). The linear layers run once over every row; attention
        runs per sequence, the very calls forward() makes for that chunk alone."""
        qkv, out, row = self.c_attn(x), [], 0
        for cache, start_pos, T in segments:
            out.append(self._attend(qkv[:, row:row + T], cache, layer, start_pos))
            row += T
        return self.c_proj(torch.cat(out, dim=1))

    def _attend(self, qkv, cache: KVCache | None, layer: int, start_pos: int):
        """(B, T, 3C) queries, keys and values -> (B, T, C) attention outputs, heads side by side."""
        B, T, C3 = qkv.size()
        C = C3 // 3
        q, k, v = qkv.split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            end = start_pos + T
            cache.k[layer][:B, :, start_pos:end] = k
            cache.v[layer][:B, :, start_pos:end] = v
            k = cache.k[layer][:B, :, :end].to(q.dtype)  # (B, nh, end, hs): everything seen so far
            v = cache.v[layer][:B, :, :end].to(q.dtype)  # (a no-op unless the cache is kept in 16 bits)
            if T == 1:
                # one new token may look at every cached position: no mask needed
                y = F.scaled_dot_product_attention(q, k, v)
            elif start_pos == 0:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # a later prefill chunk: query i sits at position start_pos + i. SDPA's is_causal
                # aligns the mask top-left, which is wrong when T != end, so spell it out.
                mask = torch.ones(T, end, dtype=torch.bool, device=qkv.device).tril(diagonal=start_pos)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        return y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side

    def decode(self, x, norm: nn.LayerNorm, caches: list[KVCache], layer: int, positions: list[int]):
        """x + attention(norm(x)) for one new token per row (x: (B, 1, C)), each row a sequence of its own:
        its own cache and position. The norm and the residual add happen inside the linear layers' calls.

        Each row attends over its own history alone, so a row's result does not depend on the others
        (nor on their lengths: no padding, no mask). With one token per row the heads need no transposes:
        (B, 3, nh, 1, hs) -> per row (1, nh, 1, hs) queries, and outputs that are already (1, C)."""
        B, _, C = x.size()
        qkv = self.c_attn(x, decode=True, norm=norm).view(B, 3, self.n_head, 1, C // self.n_head)
        out = torch.empty(B, self.n_head, 1, C // self.n_head, dtype=x.dtype, device=x.device)
        fused = kernels.attends(qkv, out, caches[0].k[layer])  # every cache is made alike (GPT.new_cache)
        for r, (cache, pos) in enumerate(zip(caches, positions)):
            keys, values = cache.k[layer], cache.v[layer]  # (1, nh, max_len, hs)
            q, k, v = qkv[r, 0], qkv[r, 1], qkv[r, 2]  # (nh, 1, hs) each
            if fused:  # writes k and v, then reads the cache once, at the machine's bandwidth
                kernels.attend(q, k, v, keys, values, pos, out[r])
                continue
            keys[0, :, pos:pos + 1] = k
            values[0, :, pos:pos + 1] = v
            # 4-D, as SDPA's fused CPU kernel wants it (3-D inputs take its slow reference path)
            out[r:r + 1] = F.scaled_dot_product_attention(q[None], keys[:, :, :pos + 1].to(q.dtype),
                                                          values[:, :, :pos + 1].to(q.dtype))
        return self.c_proj(out.view(B, 1, C), decode=True, residual=x)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))

    def decode(self, x, norm: nn.LayerNorm):
        """x + mlp(norm(x)) for one new token per row, the norm, GELU and residual add inside the calls."""
        return self.c_proj(self.c_fc(x, decode=True, norm=norm, gelu=True), decode=True, residual=x)


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, layer: int = 0, start_pos=0):
        """cache/start_pos: None (no cache); one KVCache and an int (one sequence, T tokens); or one
        KVCache and one position per row (several sequences, one token each: decoding, where the kernel
        may update x in place and return it)."""
        if isinstance(cache, list):
            if self.ln_1.eps == self.ln_2.eps and kernels.block(
                    x, self._parameters_in_order(), self.ln_1.eps, self.attn.n_head, [c.k[layer] for c in cache],
                    [c.v[layer] for c in cache], start_pos):
                return x  # the whole block in one kernel call, in place
            return self.mlp.decode(self.attn.decode(x, self.ln_1, cache, layer, start_pos), self.ln_2)
        x = x + self.attn(self.ln_1(x), cache, layer, start_pos)
        x = x + self.mlp(self.ln_2(x))
        return x

    def prefill_many(self, x, segments: list[tuple[KVCache, int, int]], layer: int):
        """forward() for several sequences' prefill chunks side by side in x (see GPT.prefill_many)."""
        x = x + self.attn.prefill_many(self.ln_1(x), segments, layer)
        return x + self.mlp(self.ln_2(x))

    def _parameters_in_order(self) -> list[torch.Tensor | None]:
        """The tensors kernels.block takes, in nanoGPT's order (a linear layer: weight, scale, bias)."""
        attn, mlp = self.attn, self.mlp
        tensors: list[torch.Tensor | None] = [self.ln_1.weight, self.ln_1.bias]
        for linear in (attn.c_attn, attn.c_proj):
            tensors += [linear.weight, linear.scale, linear.bias]
        tensors += [self.ln_2.weight, self.ln_2.bias]
        for linear in (mlp.c_fc, mlp.c_proj):
            tensors += [linear.weight, linear.scale, linear.bias]
        return tensors


class GPT(nn.Module):
    transformer: Any  # nanoGPT's ModuleDict: wte, wpe, h (the blocks), ln_f

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
        self.kv_dtype: torch.dtype | None = None  # the KV cache's dtype; None: the activations' (precision.py)

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
        p = self.transformer.wte.weight  # the activations' dtype (lm_head may hold int8 weights)
        return KVCache(self.config, batch, max_len or self.config.block_size, p.device, self.kv_dtype or p.dtype)

    def forward_cached(self, idx, cache: KVCache, start_pos: int, logits: bool = True):
        """Run tokens idx (1, T) of one sequence at positions start_pos.. start_pos+T-1, storing their
        keys and values in `cache`, and return the logits of the last position, (1, V) (None with
        logits=False: a prefill chunk before the last needs only its keys and values, not lm_head).

        Positions before start_pos must already be in the cache. Prefill a prompt with start_pos=0
        (whole or in chunks); then decode with decode_step, alone or together with other sequences.
        """
        if start_pos + idx.size(1) > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions; asked for {start_pos + idx.size(1)}")
        x = self._embed(idx, start_pos)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache, layer, start_pos)
        if not logits:
            return None
        x = self.transformer.ln_f(x[:, -1, :])  # (B, C): only the last position is needed
        return self.lm_head(x)  # (B, V)

    def prefills_together(self) -> bool:
        """Whether prefill_many gives every chunk the same bits as forward_cached alone: on CPU, with every
        linear layer a float32 `Linear` on oneDNN's inner product, which sums each row the same way
        whatever the number of rows (bfloat16 and int8 prefill kernels do not: tests/chat/model)."""
        return all(type(m) is Linear and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"
                   for m in self.modules() if isinstance(m, DecodingLinear)) and _ONEDNN

    def prefill_many(self, chunks: list[tuple[list[int], KVCache, int, bool]]) -> list[torch.Tensor | None]:
        """forward_cached for several sequences at once: chunk i is (its token ids, its cache, its start
        position, whether it needs logits). Their rows run side by side through every linear layer, so
        the weights are read once for all of them; attention is per sequence. -> each chunk's logits (1, V),
        or None. Only where prefills_together(): otherwise call forward_cached per chunk."""
        segments, pieces = [], []
        for ids, cache, start_pos, _ in chunks:
            if start_pos + len(ids) > cache.max_len:
                raise ValueError(f"KV cache holds {cache.max_len} positions; asked for {start_pos + len(ids)}")
            idx = torch.tensor([ids], dtype=torch.long, device=self.lm_head.weight.device)
            pieces.append(self._embed(idx, start_pos))
            segments.append((cache, start_pos, len(ids)))
        x = torch.cat(pieces, dim=1)  # (1, ΣT, C)
        for layer, block in enumerate(self.transformer.h):
            x = block.prefill_many(x, segments, layer)
        ends, row = [], 0
        for ids, _, _, logits in chunks:
            row += len(ids)
            ends.append(row - 1 if logits else None)
        wanted = [end for end in ends if end is not None]
        if not wanted:
            return [None] * len(chunks)
        found = iter(self.lm_head(self.transformer.ln_f(x[0, wanted, :])).split(1))  # (1, V) each
        return [next(found) if end is not None else None for end in ends]

    def decode_step(self, idx, caches: list[KVCache], positions: list[int]):
        """One new token for each of B sequences: idx (B, 1), row r at positions[r] of caches[r]
        (one cache per sequence, batch 1 each). -> logits (B, V).

        The weights are read once for all rows; attention runs per row over its own cache. A row's
        logits are the same, bit for bit on CPU, whatever the other rows are (see Linear)."""
        if not idx.size(0) == len(caches) == len(positions):
            raise ValueError(f"{idx.size(0)} rows, {len(caches)} caches and {len(positions)} positions: one each")
        for cache, pos in zip(caches, positions):
            if pos >= cache.max_len:
                raise ValueError(f"KV cache holds {cache.max_len} positions; asked for {pos + 1}")
        rows = torch.tensor(positions, dtype=torch.long, device=idx.device).view(-1, 1)  # (B, 1)
        x = self.transformer.wte(idx) + self.transformer.wpe(rows)  # (B, 1, C)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, caches, layer, positions)
        return self.lm_head(x[:, -1, :], decode=True, norm=self.transformer.ln_f)  # (B, V)
