"""What the looped transformer (looped.py) carries from one loop to the next and what it returns: a whole
run's outputs (LoopOutput), the rows looping side by side (LoopRows) and one loop of each row (LoopStep).

Shapes: B rows, T prompt positions, nh heads, hs head size, C n_embd, P and S the completion head's."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LoopOutput:
    scores: torch.Tensor          # [B, loops_run, 26] readout scores over A..Z
    stop_logits: torch.Tensor     # [B, loops_run] completion-head logits
    state_logits: torch.Tensor    # [B, loops_run, 26] direct readout of the lookup
    halted_at: torch.Tensor       # [B] first loop whose stop prob >= threshold, 0 = never
    start_scores: torch.Tensor    # [B, 26] the start letter as read from the prompt


@dataclass
class LoopRows:
    """Tables looping side by side (forward()'s batch, or many Loop-lab runs stepped together), each
    at its own loop: what a row carries from one loop to the next."""

    kv: tuple[torch.Tensor, torch.Tensor]  # the prompt's keys and values, [B, nh, T, hs] each
    mask: torch.Tensor            # [B, T]
    k_vectors: torch.Tensor       # [B, P, S] k as the completion head compares it
    letter: torch.Tensor          # [B] the letter each row is on (its last prediction)
    loops: torch.Tensor           # [B] the loop each row runs next (1 first)
    state: torch.Tensor           # [B, C] the loop block's output at its last loop (zeros before loop 1)
    injection: torch.Tensor | None = None  # [B, C] the prompt, injected every loop (the latent model)

    def take(self, index: torch.Tensor) -> LoopRows:
        """These rows only, in this order."""
        return LoopRows((self.kv[0][index], self.kv[1][index]), self.mask[index], self.k_vectors[index],
                        self.letter[index], self.loops[index], self.state[index],
                        None if self.injection is None else self.injection[index])

    @staticmethod
    def cat(parts: list[LoopRows]) -> LoopRows:
        """Rows of several batches as one (all with prompts of one length)."""
        return LoopRows((torch.cat([p.kv[0] for p in parts]), torch.cat([p.kv[1] for p in parts])),
                        torch.cat([p.mask for p in parts]), torch.cat([p.k_vectors for p in parts]),
                        torch.cat([p.letter for p in parts]), torch.cat([p.loops for p in parts]),
                        torch.cat([p.state for p in parts]),
                        _cat_injections(parts))


@dataclass
class LoopStep:
    """One loop of each row (LoopTransformer.step)."""

    scores: torch.Tensor          # [B, 26] readout scores over A..Z
    stop_logits: torch.Tensor     # [B] completion-head logits
    state_logits: torch.Tensor    # [B, 26] direct readout of the lookup
    attention: torch.Tensor       # [B, nh, T] where the loop block looked in the prompt
    # [B] ‖h_t − h_{t−1}‖ / ‖h_{t−1}‖ over the loop block's output h at its one query position (the
    # vector the readout reads): how much the state moved since the previous loop; NaN at loop 1
    state_change: torch.Tensor
    # [B, C] the loop block's output h_t (the latent model's carried state); None from a step() that keeps
    # its state to itself (an owner's batched model written before it was asked for)
    state: torch.Tensor | None = None


def _cat_injections(parts: list[LoopRows]) -> torch.Tensor | None:
    injections = [p.injection for p in parts if p.injection is not None]
    return torch.cat(injections) if injections else None
