"""A looped transformer that carries its latent state from loop to loop.

The bundled model (looped.py) hands the next loop only its own argmax letter, re-embedded: nothing else
survives a loop, so its state cannot drift, settle or wander. This one hands the next loop the loop
block's whole output vector h_t, the way recurrent-depth models do (Geiping et al. 2025, "Scaling up
test-time compute with latent reasoning"; Saunshi et al. 2025, "Reasoning with latent thoughts"):

    s_0 = the start letter as the slot reader read it               [B, C]
    e   = W_inject s_0, the prompt injected again every loop          [B, C]
    s_t = LoopBlock(s_{t-1} + e)  (cross-attention over the prompt, then an MLP)

Everything else is the bundled model's: the prompt encoder, the slot reader, the tied readout of s_t
over the 26 letters, and the completion head comparing the loop counter with k digit by digit (it sees
only the counter and k, never the state, so it stops at k however far the state has drifted).

There is no teacher forcing: loop t's input is loop t-1's state, so training unrolls the loops and
back-propagates through them (`unroll`). The loops it was unrolled for are its trained depth; beyond
them nothing made the state stay on the letters' manifold, which is what the Loop lab shows.
"""

import torch
import torch.nn as nn

from webapp.loops.model.loop_state import LoopRows
from webapp.loops.model.looped import LoopConfig, LoopTransformer, rowwise_linear


class LatentLoopTransformer(LoopTransformer):
    carries_state = True

    def __init__(self, config: LoopConfig):
        super().__init__(config)
        C = config.n_embd
        # Zero at first: training starts as a purely latent loop and learns how much of the prompt
        # to inject.
        self.inject = nn.Linear(C, C, bias=False)
        nn.init.zeros_(self.inject.weight)

    def start(self, input_ids, attention_mask=None, readout_token_ids=None) -> tuple[LoopRows, torch.Tensor]:
        """Read the prompts: -> (the rows, their state s_0 the start letter as read; its scores [B, 26])."""
        ids = self._ids(readout_token_ids)
        kv, mask, slots = self.encode(input_ids, attention_mask)
        s0 = slots[:, 0]                                                            # [B, C]
        start_scores = rowwise_linear(self.ln_f(s0), self._readout_rows(ids))      # [B, 26]
        B = input_ids.size(0)
        rows = LoopRows(kv, mask, self.completion_head.project_k(slots[:, 1:]), start_scores.argmax(-1),
                        torch.ones(B, dtype=torch.long, device=input_ids.device), s0,
                        rowwise_linear(s0, self.inject.weight))
        return rows, start_scores

    def loop_input(self, rows: LoopRows, ids: torch.Tensor) -> torch.Tensor:
        """What a loop starts from: the last loop's state plus the injected prompt, [B, 1, C]."""
        assert rows.injection is not None
        return (rows.state + rows.injection).unsqueeze(1)

    # -- training -------------------------------------------------------------------
    def unroll(self, input_ids, n_loops: int, stop_loops: int, readout_token_ids=None, attention_mask=None):
        """Training: n_loops loops from the start, with gradients through every one of them.

        -> dict of scores/state_logits [B, n_loops, 26], rule_scores [B, 26, 26] (one loop from each
        letter's embedding: where each rule leads), stop_logits [B, stop_loops] (the completion
        head for loops 1..stop_loops: it never reads the state, so it trains on loops the hop is never
        unrolled to), start_scores [B, 26], digit_logits [B, P, 10]."""
        ids = self._ids(readout_token_ids)
        kv, mask, slots = self.encode(input_ids, attention_mask)
        s = slots[:, 0]
        e = self.inject(s)
        hs, lookups = [], []
        for _ in range(n_loops):
            a, h = self.loop_block((s + e).unsqueeze(1), kv, mask)                 # [B, 1, C] each
            s = h[:, 0]
            hs.append(h)
            lookups.append(a)
        # every rule once, from its source letter's embedding as the state: the hop as a lookup
        letters = self.wte(ids).expand(s.size(0), -1, -1)                       # [B, 26, C]
        _, rules = self.loop_block(letters + e.unsqueeze(1), kv, mask)
        loops = torch.arange(1, stop_loops + 1, device=input_ids.device)
        return {"rule_scores": self.readout(rules, ids), "scores": self.readout(torch.cat(hs, 1), ids),
                "state_logits": self.readout(torch.cat(lookups, 1), ids),
                "stop_logits": self.completion_head(loops, self.completion_head.project_k(slots[:, 1:])),
                "start_scores": self.readout(slots[:, 0], ids), "digit_logits": self.read_digits(slots)}


def model_class(config: LoopConfig) -> type[LoopTransformer]:
    """The class a bundle's config names (its `carry`)."""
    classes = {"letter": LoopTransformer, "latent": LatentLoopTransformer}
    if config.carry not in classes:
        raise ValueError(f"carry is {config.carry!r}, expected one of {sorted(classes)}")
    return classes[config.carry]
