"""A GPT in nanoGPT's parameter layout, with a preallocated KV cache for decoding.

Parameter names match nanoGPT (and so the owner's checkpoints):
    transformer.wte, transformer.wpe, transformer.h.N.{ln_1, attn.c_attn, attn.c_proj,
    ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f, lm_head (weight tied to wte).

One forward per purpose:
    model(idx, targets=None) -> (logits, loss)       the seed's contract (training, full recompute): the
                                                      hooked forward every experiment reads (hooked.py)
    model.prefill(chunks)                             prefill chunks of one or several sequences' KVCaches
    model.decode_step(idx, caches, positions, edits)  one token for each of several sequences
The serving paths also hand back the stream after chosen blocks where they give logits (`taps`: dictionaries').

Each takes an optional edit per sequence (webapp/chat/model/edits.py): every head's output passes
edits.edit_heads before c_proj, every MLP's output edits.edit_mlp before its residual add, and the stream
after every block edits.edit_resid. Attention's math is attention.py's, in every one of them.

Shapes: B batch, T time (tokens), C n_embd, nh n_head, hs head size (C // nh), V vocab_size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F

from webapp.chat.model import hooked, kernels
from webapp.chat.model.attention import attend, merge_heads, split_heads
from webapp.chat.model.edits import Edit, edit_heads, edit_mlp, edit_resid
from webapp.chat.model.linear import DecodingLinear, Linear
from webapp.nn.rowwise import ONEDNN


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


Taps = dict[int, Tensor | None]  # block L -> the residual stream after it, filled in by prefill/decode_step


class KVCache:
    """Keys and values of every layer, preallocated for `max_len` positions.

    k, v: one (B, nh, max_len, hs) tensor per layer. Separate tensors, not slices of one: under
    torch.compile a write into a slice of a shared tensor copied the whole cache every step.
    One cache holds one sequence (batch 1): sequences decoded together each keep their own, so
    each can be kept for its conversation's next turn (webapp/chat/decode/prefix_cache.py).
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device: torch.device | str | None,
                 dtype: torch.dtype) -> None:
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


@dataclass
class Chunk:
    """One sequence's prefill chunk: its token ids, run at positions start..start+len(ids)-1 of its cache."""

    ids: Sequence[int]
    cache: KVCache
    start: int = 0
    logits: bool = True  # whether its last position's logits are wanted (a prompt's last chunk)
    edit: Edit | None = None  # the sequence's edit (None: the model's own run)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v at once
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def prefill(self, x: Tensor, chunks: list[Chunk], layer: int) -> Tensor:
        """Attention for several sequences' prefill chunks side by side in x (1, ΣT, C), each at its own
        positions, writing its keys and values into its own cache. The linear layers run once over every
        row; attention runs per chunk, the very calls made for that chunk alone."""
        qkv, out = self.c_attn(x), []
        for chunk, (a, b) in zip(chunks, _rows(chunks)):
            y = self._attend_cached(qkv[:, a:b], chunk.cache, layer, chunk.start)  # (1, nh, T, hs)
            out.append(merge_heads(edit_heads(y, layer, chunk.edit, chunk.start)))
        return self.c_proj(torch.cat(out, dim=1))

    def _attend_cached(self, qkv: Tensor, cache: KVCache, layer: int, start_pos: int) -> Tensor:
        """(1, T, 3C) for positions start_pos..start_pos+T-1 -> (1, nh, T, hs) heads' outputs, having written
        their keys and values into `cache` (positions before start_pos must be there already)."""
        q, k, v = split_heads(qkv, self.n_head)
        B, T = q.size(0), q.size(2)
        end = start_pos + T
        cache.k[layer][:B, :, start_pos:end] = k
        cache.v[layer][:B, :, start_pos:end] = v
        k = cache.k[layer][:B, :, :end].to(q.dtype)  # (B, nh, end, hs): everything seen so far
        v = cache.v[layer][:B, :, :end].to(q.dtype)  # (a no-op unless the cache is kept in 16 bits)
        return attend(q, k, v)

    def decode(self, x: Tensor, norm: nn.LayerNorm, caches: list[KVCache], layer: int, positions: list[int],
               edits: list[Edit | None]) -> Tensor:
        """x + attention(norm(x)) for one new token per row (x: (B, 1, C)), each row a sequence of its own:
        its own cache, position and edit. The norm and the residual add happen inside the linear layers' calls.

        Each row attends over its own history alone, so a row's result does not depend on the others
        (nor on their lengths: no padding, no mask). With one token per row the heads need no transposes:
        (B, 3, nh, 1, hs) -> per row (1, nh, 1, hs) queries, and outputs that are already (1, C)."""
        B, _, C = x.size()
        qkv = self.c_attn(x, decode=True, norm=norm).view(B, 3, self.n_head, 1, C // self.n_head)
        out = torch.empty(B, self.n_head, 1, C // self.n_head, dtype=x.dtype, device=x.device)  # (B, nh, 1, hs)
        fused = kernels.attends(qkv, out, caches[0].k[layer])  # every cache is made alike (GPT.new_cache)
        for r, (cache, pos) in enumerate(zip(caches, positions)):
            keys, values = cache.k[layer], cache.v[layer]  # (1, nh, max_len, hs)
            q, k, v = qkv[r, 0], qkv[r, 1], qkv[r, 2]  # (nh, 1, hs) each
            if fused:  # writes k and v, then reads the cache once, at the machine's bandwidth
                kernels.attend(q, k, v, keys, values, pos, out[r])
            else:
                keys[0, :, pos:pos + 1] = k
                values[0, :, pos:pos + 1] = v
                # 4-D, as SDPA's fused CPU kernel wants it (3-D inputs take its slow reference path)
                out[r:r + 1] = attend(q[None], keys[:, :, :pos + 1].to(q.dtype), values[:, :, :pos + 1].to(q.dtype))
            if edits[r] is not None:
                out[r:r + 1] = edit_heads(out[r:r + 1], layer, edits[r], pos)
        return self.c_proj(out.view(B, 1, C), decode=True, residual=x)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))

    def decode(self, x: Tensor, norm: nn.LayerNorm, layer: int, positions: list[int],
               edits: list[Edit | None]) -> Tensor:
        """x + mlp(norm(x)) for one new token per row, the norm, GELU and residual add inside the calls
        (the add after them where a row's edit replaces this MLP's output)."""
        h = self.c_fc(x, decode=True, norm=norm, gelu=True)  # (B, 1, 4C)
        if all(edit is None or not edit.mlps_at(layer) for edit in edits):  # (adds come after the block)
            return self.c_proj(h, decode=True, residual=x)
        out = self.c_proj(h, decode=True)  # (B, 1, C)
        for r, (edit, pos) in enumerate(zip(edits, positions)):
            if edit is not None:
                out[r:r + 1] = edit_mlp(out[r:r + 1], layer, edit, pos)
        return x + out


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def prefill(self, x: Tensor, chunks: list[Chunk], layer: int) -> Tensor:
        """x (1, ΣT, C): several sequences' prefill chunks side by side (see GPT.prefill)."""
        x = x + self.attn.prefill(self.ln_1(x), chunks, layer)
        out: Tensor = self.mlp(self.ln_2(x))  # (1, ΣT, C)
        for chunk, (a, b) in zip(chunks, _rows(chunks)):
            if chunk.edit is not None:
                out[:, a:b] = edit_mlp(out[:, a:b], layer, chunk.edit, chunk.start)
        x = x + out
        if not any(chunk.edit is not None and chunk.edit.changes_stream_at(layer) for chunk in chunks):
            return x
        return torch.cat([edit_resid(x[:, a:b], layer, chunk.edit, chunk.start)
                          for chunk, (a, b) in zip(chunks, _rows(chunks))], dim=1)

    def decode(self, x: Tensor, caches: list[KVCache], layer: int, positions: list[int],
               edits: list[Edit | None]) -> Tensor:
        """One new token per row, x (B, 1, C), row r a sequence of its own (caches[r], positions[r],
        edits[r]); the kernel may update x in place and return it. Rows without an edit that replaces outputs
        run the whole block in one kernel call where it can; a row with one never does: it takes the per-layer
        path, where its heads' and MLP's outputs pass edit_heads and edit_mlp. Vectors an edit adds after the
        block are added last, whichever path the row took. A row's result is the same whichever other rows
        are in the batch and whichever path they take."""
        x = self._decode_block(x, caches, layer, positions, edits)
        for r, (edit, pos) in enumerate(zip(edits, positions)):
            if edit is not None and edit.changes_stream_at(layer):  # after the block, whichever path it took
                x[r:r + 1] = edit_resid(x[r:r + 1], layer, edit, pos)
        return x

    def _decode_block(self, x: Tensor, caches: list[KVCache], layer: int, positions: list[int],
                      edits: list[Edit | None]) -> Tensor:
        """The block itself for Block.decode: the fused kernel for the rows whose edit replaces no output."""
        edited = [r for r, edit in enumerate(edits) if edit is not None and edit.replaces]
        if not edited and self._fused(x, caches, layer, positions):
            return x  # the whole block in one kernel call, in place
        if not edited or len(edited) == len(edits):
            return self.mlp.decode(self.attn.decode(x, self.ln_1, caches, layer, positions, edits), self.ln_2,
                                   layer, positions, edits)
        plain = [r for r in range(len(edits)) if r not in edited]
        for rows in (plain, edited):
            x[rows] = self._decode_block(x[rows], [caches[r] for r in rows], layer, [positions[r] for r in rows],
                                         [edits[r] for r in rows])
        return x

    def _fused(self, x: Tensor, caches: list[KVCache], layer: int, positions: list[int]) -> bool:
        """The whole block's decode step in one kernel call, in place on x; False: not done (no kernel)."""
        plan = self._kernel_plan()
        return plan is not None and kernels.block(x, plan, [c.k[layer] for c in caches], [c.v[layer] for c in caches],
                                                  positions)

    def _kernel_plan(self) -> kernels.BlockPlan | None:
        """The kernel's plan of this block's parameters, made once (checking them every step cost more than
        a small model's step): made again when a part is replaced (apply_precision) or moved (_apply)."""
        parts = (self.ln_1, self.ln_2, self.attn.c_attn, self.attn.c_proj, self.mlp.c_fc, self.mlp.c_proj)
        made = self.__dict__.get("_plan")  # a plain attribute: never a parameter, buffer or submodule
        if made is None or any(a is not b for a, b in zip(made[0], parts)):
            plan = (kernels.plan_block(self._parameters_in_order(), self.ln_1.eps, self.attn.n_head)
                    if self.ln_1.eps == self.ln_2.eps else None)
            self.__dict__["_plan"] = made = (parts, plan)  # the parts held, so none's id is reused while it lives
        return made[1]

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.__dict__.pop("_plan", None)  # .to(), .float(), ...: the tensors may move
        return super()._apply(fn, recurse)  # type: ignore[no-untyped-call]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_plan"}  # a copy's plan points at its own tensors

    def _parameters_in_order(self) -> list[Tensor | None]:
        """The tensors kernels.block takes, in nanoGPT's order (a linear layer: weight, scale, bias)."""
        attn, mlp = self.attn, self.mlp
        tensors: list[Tensor | None] = [self.ln_1.weight, self.ln_1.bias]
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

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameters counted once (wte and lm_head share one tensor)."""
        return sum(p.numel() for p in self.parameters())

    def _check_positions(self, start_pos: int, T: int) -> None:
        if start_pos + T > self.config.block_size:
            raise ValueError(f"positions {start_pos}..{start_pos + T - 1} exceed block_size {self.config.block_size}")

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                edit: Edit | None = None) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) token ids -> (logits, loss).

        With targets (B, T) (-1 = ignore), logits are (B, T, V) and loss is the mean cross-entropy.
        Without targets, as nanoGPT does, only the last position is projected: logits are (B, 1, V)
        and loss is None. Callers take logits[:, -1, :] either way. edit: replaced outputs (edits.py).
        """
        self._check_positions(0, idx.size(1))
        x = hooked.run(self, hooked.embed(self, idx), edits=edit).x
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

    def prefills_together(self) -> bool:
        """Whether prefill() gives every chunk of several the same bits as that chunk alone: on CPU, with every
        linear layer a float32 `Linear` on oneDNN's inner product, which sums each row the same way
        whatever the number of rows (bfloat16 and int8 prefill kernels do not: tests/chat/model)."""
        linears: list[nn.Module] = [m for m in self.modules() if isinstance(m, DecodingLinear)]
        return all(type(m) is Linear and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"
                   for m in linears) and ONEDNN

    def prefill(self, chunks: list[Chunk], taps: Taps | None = None) -> list[Tensor | None]:
        """Run each chunk's tokens at its positions start..start+T-1, storing their keys and values in its
        cache (positions before start must be there already) -> each chunk's last position's logits (1, V),
        or None for a chunk that does not want them (a prefill chunk before a prompt's last needs only its
        keys and values, not lm_head).

        One chunk is one sequence's prefill step; several run side by side through every linear layer, so
        the weights are read once for all of them, and attention is per chunk. Several only where
        prefills_together(): otherwise call it once per chunk. taps: for each block L named in it, the stream
        after block L at the positions given logits (len(wanted), C), in the chunks' order, written into it."""
        pieces = []
        for chunk in chunks:
            if chunk.start + len(chunk.ids) > chunk.cache.max_len:
                raise ValueError(f"KV cache holds {chunk.cache.max_len} positions; asked for "
                                 f"{chunk.start + len(chunk.ids)}")
            idx = torch.tensor([list(chunk.ids)], dtype=torch.long, device=self.lm_head.weight.device)  # (1, T)
            self._check_positions(chunk.start, len(chunk.ids))
            pieces.append(hooked.embed(self, idx, chunk.start))
        x = torch.cat(pieces, dim=1)  # (1, ΣT, C)
        ends = [b - 1 if chunk.logits else None for chunk, (_, b) in zip(chunks, _rows(chunks))]
        wanted = [end for end in ends if end is not None]
        for layer, block in enumerate(self.transformer.h):
            x = block.prefill(x, chunks, layer)
            if taps is not None and layer in taps:
                taps[layer] = x[0, wanted, :]  # (len(wanted), C): indexing by a list copies
        if not wanted:
            return [None] * len(chunks)
        logits = self.lm_head(self.transformer.ln_f(x[0, wanted, :]))  # (len(wanted), V)
        found = iter(torch.split(logits, 1))  # (1, V) each
        return [next(found) if end is not None else None for end in ends]

    def decode_step(self, idx: Tensor, caches: list[KVCache], positions: list[int],
                    edits: list[Edit | None] | None = None, taps: Taps | None = None) -> Tensor:
        """One new token for each of B sequences: idx (B, 1), row r at positions[r] of caches[r]
        (one cache per sequence, batch 1 each), with edits[r] (None: the model's own run). -> logits (B, V).

        The weights are read once for all rows; attention runs per row over its own cache. A row's
        logits are the same, bit for bit on CPU, whatever the other rows are (see Linear), edited or not.
        taps: for each block L named in it, the stream after block L (B, C), written into it."""
        edits = edits if edits is not None else [None] * len(caches)
        if not idx.size(0) == len(caches) == len(positions) == len(edits):
            raise ValueError(f"{idx.size(0)} rows, {len(caches)} caches, {len(positions)} positions and "
                             f"{len(edits)} edits: one each")
        for cache, pos in zip(caches, positions):
            if pos >= cache.max_len:
                raise ValueError(f"KV cache holds {cache.max_len} positions; asked for {pos + 1}")
        rows = torch.tensor(positions, dtype=torch.long, device=idx.device).view(-1, 1)  # (B, 1)
        x = self.transformer.wte(idx) + self.transformer.wpe(rows)  # (B, 1, C)
        for layer, block in enumerate(self.transformer.h):
            x = block.decode(x, caches, layer, positions, edits)
            if taps is not None and layer in taps:
                taps[layer] = x[:, -1, :].clone()  # (B, C): the next block's kernel writes x in place
        return self.lm_head(x[:, -1, :], decode=True, norm=self.transformer.ln_f)  # (B, V)


def _rows(chunks: list[Chunk]) -> list[tuple[int, int]]:
    """Each chunk's rows a..b of the prefill's (1, ΣT, C) stream."""
    ends = list(itertools.accumulate(len(chunk.ids) for chunk in chunks))
    return [(end - len(chunk.ids), end) for chunk, end in zip(chunks, ends)]
