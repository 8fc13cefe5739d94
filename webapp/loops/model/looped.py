"""A looped transformer for pointer chasing, in one file.

Reading order: config, the prompt encoder (a short convolution block), the
slot reader (learned queries that read the start letter and k's digits), the
loop block (one weight-shared cross-attention block applied once per hop), the
completion head (a learned stop decision comparing the loop counter with k,
digit place by digit place), and the model with its two forwards:

- `forward`: the native inference loop. Each loop re-embeds the model's OWN
  argmax letter from the previous loop; nothing from the reference trajectory
  is ever given to it. Calls `loop_callback` after every loop and halts when
  sigmoid(stop logit) >= completion_threshold, or at num_loops.
- `teacher_forward`: training. The only state carried between loops is the
  re-embedded letter (plus the loop number, which only the completion head
  sees), so with the true letters as inputs all loops are computed at once,
  the way a GPT is trained in parallel and sampled one token at a time.

Ideas borrowed: looped / Universal Transformers (Dehghani et al. 2018) for the
weight-shared loop with a learned halting decision; Perceiver / Set
Transformer pooling (learned queries) for the slot reader; a tied embedding
readout (Press & Wolf 2017) scaled by 1/sqrt(d).
"""

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

from webapp.loops.model.loop_state import LoopOutput, LoopRows, LoopStep
from webapp.nn.rowwise import onednn_linear

N_SYMBOLS = 26


def rowwise_linear(x, weight, bias=None):
    """x @ weightᵀ + bias, each row's sums in the same order whatever else is in the batch (oneDNN's
    inner product on the CPU at inference; webapp/chat/model/gpt.py), so a table looped beside others
    gets the very numbers it gets alone. Elsewhere (training, a GPU) plain F.linear."""
    if (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and not torch.is_grad_enabled()
            and torch.backends.mkldnn.is_available()):
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _linear(x, layer):
    return rowwise_linear(x, layer.weight, layer.bias)


@dataclass
class LoopConfig:
    vocab_size: int = 41
    block_size: int = 96        # longest prompt; v1 prompts are 88 characters
    n_embd: int = 64
    n_head: int = 2
    conv_kernel: int = 3        # each letter sees its neighbours: source <-> destination
    mlp_ratio: int = 4
    n_places: int = 3           # k and the loop counter as hundreds, tens, units
    stop_dim: int = 16          # width of the per-place comparison space
    stop_hidden: int = 16
    qk_init_gain: float = 2.0   # loop attention's q/k start near gain * identity
    # what a loop hands the next: "letter" (its own argmax, re-embedded: LoopTransformer) or "latent"
    # (its whole state vector: LatentLoopTransformer, webapp/loops/model/latent.py)
    carry: str = "letter"
    readout_token_ids: list[int] = field(default_factory=lambda: list(range(26)))
    digit_token_ids: list[int] = field(default_factory=lambda: list(range(26, 36)))


def loop_digits(loops: torch.Tensor, n_places: int = 3) -> torch.Tensor:
    """Loop numbers [...] -> decimal digits [..., n_places], most significant first."""
    powers = 10 ** torch.arange(n_places - 1, -1, -1, device=loops.device)
    return (loops.unsqueeze(-1) // powers) % 10


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_ratio * config.n_embd)
        self.c_proj = nn.Linear(config.mlp_ratio * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class ConvBlock(nn.Module):
    """Prompt encoder block: a short convolution along the prompt, then an MLP.

    After it the vector at a source letter also carries its destination (and the
    reverse), which lets the loop's attention find a rule by its source and read
    its destination in one step.
    """

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.conv = nn.Conv1d(config.n_embd, config.n_embd, config.conv_kernel,
                              padding=config.conv_kernel // 2)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, mask):
        # x: [B, T, C]; mask: [B, T] (1 = real token). Padding must not leak in.
        h = (self.ln_1(x) * mask.unsqueeze(-1)).transpose(1, 2)   # [B, C, T]
        x = x + self.conv(h).transpose(1, 2)
        return x + self.mlp(self.ln_2(x))


class CrossAttention(nn.Module):
    """Queries from the loop (or learned slots) attend over the encoded prompt."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.k_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.v_proj = nn.Linear(config.n_embd, config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def split(self, x):
        B, L, C = x.shape
        return x.view(B, L, self.n_head, C // self.n_head).transpose(1, 2)  # [B, nh, L, hs]

    def memory(self, mem):
        """Keys and values of the prompt, computed once and reused by every loop."""
        return self.split(self.k_proj(mem)), self.split(self.v_proj(mem))

    def forward(self, x, kv, mask):
        # x: [B, L, C] queries; kv: keys/values [B, nh, T, hs]; mask: [B, T]
        k, v = kv
        q = self.split(self.q_proj(x))
        keep = mask.bool()[:, None, None, :]                          # [B, 1, 1, T]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)   # [B, nh, L, hs]
        B, _, L, _ = y.shape
        return self.c_proj(y.transpose(1, 2).reshape(B, L, -1))

    def weights(self, x, kv, mask):
        """The attention weights forward() uses, [B, nh, L, T], each row summing to 1 over the prompt.

        Worked out beside forward(), never inside it: the fused kernel stays on the output path, so
        asking for the weights cannot change what the model predicts."""
        k, _ = kv
        q = self.split(self.q_proj(x))
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))             # [B, nh, L, T]
        return logits.masked_fill(~mask.bool()[:, None, None, :], float("-inf")).softmax(-1)


class SlotReader(nn.Module):
    """Learned queries that pick out the start letter and k's digits from the prompt."""

    def __init__(self, config):
        super().__init__()
        self.slot_queries = nn.Parameter(torch.randn(1 + config.n_places, config.n_embd))
        self.attn = CrossAttention(config)
        self.ln = nn.LayerNorm(config.n_embd)

    def forward(self, mem, mask):
        q = self.slot_queries.expand(mem.size(0), -1, -1)              # [B, 1+P, C]
        return self.ln(self.attn(q, self.attn.memory(mem), mask))     # [B, 1+P, C]


class LoopBlock(nn.Module):
    """One hop: the current letter looks up its rule; an MLP cleans the result.

    No residual from the query letter: the block's output is what it looked up,
    not where it came from.
    """

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CrossAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, z, kv, mask):
        a = self.attn(self.ln_1(z), kv, mask)    # retrieved destination, [B, L, C]
        return a, a + self.mlp(self.ln_2(a))

    def attention(self, z, kv, mask):
        """Where this hop's query looked in the prompt: [B, nh, L, T]."""
        return self.attn.weights(self.ln_1(z), kv, mask)

    def step(self, z, kv, mask):
        """forward() for one query a row [B, 1, C], every row computed alike whatever the other rows
        (rowwise_linear; attention as plain matrix products, which run per row): -> (a, h, the
        attention weights [B, nh, 1, T])."""
        attn = self.attn
        k, v = kv
        q = attn.split(_linear(self.ln_1(z), attn.q_proj))
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        weights = logits.masked_fill(~mask.bool()[:, None, None, :], float("-inf")).softmax(-1)
        y = (weights @ v).transpose(1, 2).reshape(z.size(0), 1, -1)
        a = _linear(y, attn.c_proj)
        h = a + _linear(F.gelu(_linear(self.ln_2(a), self.mlp.c_fc)), self.mlp.c_proj)
        return a, h, weights


class CompletionHead(nn.Module):
    """Learned stop decision: is this loop the k-th?

    Per digit place p, the loop counter's digit gets a learned embedding u_p and
    k's digit (the slot vector read from the prompt) a learned projection v_p;
    their scaled dot product m_p is a per-place match score. A small MLP turns
    [m_hundreds, m_tens, m_units] into the stop logit. Equality then only needs
    three matches at once, and every place is compared separately, so the head
    cannot fire at k-10 or k-100 by ignoring one place, and it generalizes to
    (loop, k) pairs never seen together in training.
    """

    def __init__(self, config):
        super().__init__()
        self.n_places = config.n_places
        self.counter_digits = nn.Embedding(10 * config.n_places, config.stop_dim)
        self.k_proj = nn.ModuleList(nn.Linear(config.n_embd, config.stop_dim)
                                    for _ in range(config.n_places))
        self.mlp = nn.Sequential(nn.Linear(config.n_places, config.stop_hidden), nn.GELU(),
                                 nn.Linear(config.stop_hidden, 1))
        last = self.mlp[-1]
        assert isinstance(last, nn.Linear)
        nn.init.constant_(last.bias, -3.0)  # stopping is rare: start "don't stop"

    def project_k(self, k_slots):
        """k's digit slots [B, P, C] -> comparison vectors [B, P, S], once per prompt."""
        return torch.stack([proj(k_slots[:, p]) for p, proj in enumerate(self.k_proj)], 1)

    def forward(self, loops, k_vectors):
        # loops: [L] loop numbers; k_vectors: [B, P, S] from project_k -> stop logits [B, L]
        place = torch.arange(self.n_places, device=loops.device)
        u = self.counter_digits(loop_digits(loops, self.n_places) + 10 * place)   # [L, P, S]
        match = torch.einsum("lps,bps->blp", u, k_vectors) / math.sqrt(u.size(-1))  # [B, L, P]
        return self.mlp(match).squeeze(-1)

    def step(self, loops, k_vectors):
        """forward() for one loop a row, each row at its own loop: loops [B] -> stop logits [B]."""
        place = torch.arange(self.n_places, device=loops.device)
        u = self.counter_digits(loop_digits(loops, self.n_places) + 10 * place)   # [B, P, S]
        match = (u * k_vectors).sum(-1) / math.sqrt(u.size(-1))                   # [B, P]
        first, last = self.mlp[0], self.mlp[2]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
        return _linear(F.gelu(_linear(match, first)), last)[:, 0]


class LoopTransformer(nn.Module):
    # forward(loop_attention=True) hands loop_callback each loop's attention; an owner's model
    # without this attribute is not asked (webapp/loops/trace.py says "not available").
    supports_loop_attention = True
    # forward(loop_state_change=True) hands loop_callback each loop's state change (LoopStep), and
    # forward(loop_state=True) the state itself.
    supports_state_change = True
    supports_loop_state = True
    # Whether that state is what the next loop starts from (LatentLoopTransformer) or only a letter is.
    carries_state = False
    # start()/step(): rows of many runs loop together, each row's numbers the same as alone
    # (webapp/loops/batch.py steps Loop-lab runs this way; an owner's model without it runs alone).
    supports_batched_loops = True

    def __init__(self, config: LoopConfig):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, C)          # N(0, 1): the readout's scale
        self.wpe = nn.Embedding(config.block_size, C)
        nn.init.normal_(self.wpe.weight, std=0.3)               # small: letters dominate matching
        self.encoder = ConvBlock(config)
        self.ln_mem = nn.LayerNorm(C)
        self.slots = SlotReader(config)
        self.loop_block = LoopBlock(config)
        self.ln_f = nn.LayerNorm(C)
        self.completion_head = CompletionHead(config)
        # q/k near gain * identity: the first attention already prefers the key
        # whose letter equals the query letter, which gets training off the plateau.
        eye = torch.eye(C) * config.qk_init_gain
        with torch.no_grad():
            for proj in (self.loop_block.attn.q_proj, self.loop_block.attn.k_proj):
                proj.weight.copy_(eye + 0.02 * torch.randn(C, C))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- pieces shared by both forwards -------------------------------------------------
    def encode(self, input_ids, attention_mask=None):
        B, T = input_ids.shape
        if T > self.config.block_size:
            raise ValueError(f"Prompt of {T} tokens exceeds block_size {self.config.block_size}")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        pos = torch.arange(T, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)                # [B, T, C]
        mem = self.ln_mem(self.encoder(x, mask))               # [B, T, C]
        slots = self.slots(mem, mask)                          # [B, 1+P, C]
        return self.loop_block.attn.memory(mem), mask, slots

    def readout(self, h, ids):
        """Tied readout over the given token ids, scaled by 1/sqrt(d)."""
        return self.ln_f(h) @ self.wte.weight[ids].t() / math.sqrt(self.config.n_embd)

    def _readout(self, h, w):
        # readout() with the [C, 26] matrix gathered once per call, for the loop
        return self.ln_f(h) @ w

    def _ids(self, readout_token_ids):
        ids = self.config.readout_token_ids if readout_token_ids is None else readout_token_ids
        ids = torch.as_tensor(list(ids), dtype=torch.long, device=self.wte.weight.device)
        if ids.shape != (N_SYMBOLS,):
            raise ValueError(f"readout_token_ids must hold 26 ids, got {tuple(ids.shape)}")
        return ids

    def read_digits(self, slots):
        """Auxiliary readout of k's digits from the slots: [B, P, 10] (training only)."""
        ids = torch.as_tensor(self.config.digit_token_ids, device=slots.device)
        return slots[:, 1:] @ self.wte.weight[ids].t() / math.sqrt(self.config.n_embd)

    # -- inference ------------------------------------------------------------------
    def start(self, input_ids, attention_mask=None, readout_token_ids=None) -> tuple[LoopRows, torch.Tensor]:
        """Read the prompts: -> (the rows, before their first loop; the start letter's scores [B, 26])."""
        ids = self._ids(readout_token_ids)
        kv, mask, slots = self.encode(input_ids, attention_mask)
        start_scores = rowwise_linear(self.ln_f(slots[:, 0]), self._readout_rows(ids))   # [B, 26]
        B = input_ids.size(0)
        rows = LoopRows(kv, mask, self.completion_head.project_k(slots[:, 1:]), start_scores.argmax(-1),
                        torch.ones(B, dtype=torch.long, device=input_ids.device),
                        torch.zeros(B, self.config.n_embd, device=input_ids.device))
        return rows, start_scores

    def _readout_rows(self, ids):
        return self.wte.weight[ids] / math.sqrt(self.config.n_embd)   # [26, C]: readout() as a linear map

    def loop_input(self, rows: LoopRows, ids: torch.Tensor) -> torch.Tensor:
        """What a loop starts from: its own last letter, re-embedded, [B, 1, C]."""
        return self.wte(ids[rows.letter]).unsqueeze(1)

    def step(self, rows: LoopRows, readout_token_ids=None) -> tuple[LoopStep, LoopRows]:
        """One loop of every row, each at its own loop; each row's numbers are the ones it gets alone,
        bit for bit on the CPU at float32. -> (what the loop gave, the rows for the next loop)."""
        ids = self._ids(readout_token_ids)
        w = self._readout_rows(ids)
        z = self.loop_input(rows, ids)                                  # [B, 1, C]
        a, h, weights = self.loop_block.step(z, rows.kv, rows.mask)
        score = rowwise_linear(self.ln_f(h[:, 0]), w)                   # [B, 26]
        state = rowwise_linear(self.ln_f(a[:, 0]), w)                   # [B, 26]
        stop = self.completion_head.step(rows.loops, rows.k_vectors)    # [B]
        h = h[:, 0]
        change = torch.linalg.vector_norm(h - rows.state, dim=-1) / torch.linalg.vector_norm(rows.state, dim=-1)
        change = torch.where(rows.loops > 1, change, torch.full_like(change, float("nan")))
        out = LoopStep(score, stop, state, weights[:, :, 0], change, h)
        return out, replace(rows, letter=score.argmax(-1), loops=rows.loops + 1, state=h)

    def forward(self, input_ids, attention_mask=None, num_loops=272, completion_threshold=0.5,
                readout_token_ids=None, loop_callback=None, loop_attention=False, loop_state_change=False,
                loop_state=False):
        """loop_attention: also pass loop_callback `attention=` the loop block's weights over the
        prompt, [B, n_head, T]; loop_state_change: `state_change=` how much the state moved, [B];
        loop_state: `state=` the loop block's output, [B, C] (LoopStep; the same outputs either way)."""
        if not 1 <= num_loops < 10 ** self.config.n_places:
            raise ValueError(f"num_loops must be from 1 to {10 ** self.config.n_places - 1}")
        rows, start_scores = self.start(input_ids, attention_mask, readout_token_ids)
        halted_at = torch.zeros(input_ids.size(0), dtype=torch.long, device=input_ids.device)
        scores, stops, states = [], [], []
        for loop in range(1, num_loops + 1):
            out, rows = self.step(rows, readout_token_ids)
            score, stop, state = out.scores, out.stop_logits, out.state_logits
            scores.append(score)
            stops.append(stop)
            states.append(state)
            if loop_callback is not None:
                extra: dict[str, torch.Tensor | None] = {"attention": out.attention} if loop_attention else {}
                if loop_state_change:
                    extra["state_change"] = out.state_change
                if loop_state:
                    extra["state"] = out.state
                loop_callback(loop, score, stop, state, **extra)     # exceptions propagate
            fired = (stop.sigmoid() >= completion_threshold) & (halted_at == 0)
            halted_at = torch.where(fired, torch.full_like(halted_at, loop), halted_at)
            if bool((halted_at > 0).all()):
                break
        return LoopOutput(scores=torch.stack(scores, 1), stop_logits=torch.stack(stops, 1),
                          state_logits=torch.stack(states, 1), halted_at=halted_at,
                          start_scores=start_scores)

    # -- training -------------------------------------------------------------------
    def teacher_forward(self, input_ids, inputs, loops, readout_token_ids=None, attention_mask=None):
        """All loops at once from given input letters.

        inputs: [B, L] letter indices (0..25) fed to loops `loops` ([L] loop
        numbers); for pointer chasing inputs[:, t-1] = x(t-1). Returns a dict of
        scores/state_logits [B, L, 26], stop_logits [B, L], start_scores [B, 26]
        and digit_logits [B, P, 10].
        """
        ids = self._ids(readout_token_ids)
        kv, mask, slots = self.encode(input_ids, attention_mask)
        a, h = self.loop_block(self.wte(ids[inputs]), kv, mask)
        return {"scores": self.readout(h, ids), "state_logits": self.readout(a, ids),
                "stop_logits": self.completion_head(loops, self.completion_head.project_k(slots[:, 1:])),
                "start_scores": self.readout(slots[:, 0], ids),
                "digit_logits": self.read_digits(slots)}
