"""A deterministic stand-in for the Loop-lab model, for testing the streaming machinery.

It honours the owner's model contract exactly, and reads the table from its own prompt (as a
real model must); behaviours are scripted: where it errs, when it stops, a NaN, a delay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from webapp.loops.task import SYMBOLS, render_prompt


class CharTok:
    def __call__(self, text, add_special_tokens=False, return_tensors="pt"):
        ids = torch.tensor([[ord(c) for c in text]])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@dataclass
class Script:
    stop_at: int | None = None          # loop at which the head fires; None = steps from the prompt
    wrong_at: set = field(default_factory=set)  # loops whose prediction is shifted by one letter
    nan_at: int | None = None
    raise_at: int | None = None         # loop at which the model itself fails
    reuse_buffers: bool = False         # write every loop's outputs into the same tensors
    direct_from: int = 1                # first loop with a direct readout (state_logits); None before
    delay: float = 0.0                  # seconds per loop


@dataclass
class Output:
    scores: torch.Tensor
    stop_logits: torch.Tensor


class ScriptedLoopModel(nn.Module):
    def __init__(self, script: Script | None = None):
        super().__init__()
        self.script = script or Script()
        self.completion_head = nn.Linear(1, 1)
        self.loops_run = 0
        self.threads_seen: int | None = None  # torch's intra-op threads while it ran
        self.eval()

    def forward(self, input_ids, attention_mask, num_loops, completion_threshold, readout_token_ids,
                loop_callback):
        self.threads_seen = torch.get_num_threads()
        text = "".join(chr(i) for i in input_ids[0].tolist())
        table_text, start, steps = text.split(";")[0], text.split(";s=")[1][0], int(text.split(";k=")[1][:3])
        mapping = {rule[0]: rule[1] for rule in table_text.split(" ")}
        stop_at = self.script.stop_at or steps
        current, all_scores, all_stops = start, [], []
        scores, stop = torch.empty(1, 26), torch.empty(1)
        for loop in range(1, num_loops + 1):
            current = mapping[current]  # follows its own state, never a reference
            shown = SYMBOLS[(SYMBOLS.index(current) + 1) % 26] if loop in self.script.wrong_at else current
            if not self.script.reuse_buffers:
                scores, stop = torch.empty(1, 26), torch.empty(1)
            scores.fill_(-4.0)
            scores[0, SYMBOLS.index(shown)] = 4.0
            if loop == self.script.nan_at:
                scores[0, 0] = float("nan")
            stop.fill_(8.0 if loop == stop_at else -8.0)
            time.sleep(self.script.delay)
            self.loops_run = loop
            if loop == self.script.raise_at:
                raise RuntimeError("scripted failure")
            state = scores.clone() if loop >= self.script.direct_from else None
            loop_callback(loop, scores, stop, state)
            all_scores.append(scores)
            all_stops.append(stop)
            if stop.sigmoid().item() >= completion_threshold:
                break
        return Output(torch.stack(all_scores, 1), torch.stack(all_stops, 1))


@dataclass
class Bundle:
    model: ScriptedLoopModel
    tokenizer: CharTok = field(default_factory=CharTok)
    readout_token_ids: list = field(default_factory=lambda: [ord(s) for s in SYMBOLS])
    checkpoint_id: str = "test:scripted"
    render_prompt: object = staticmethod(render_prompt)


def bundle(**script) -> Bundle:
    return Bundle(ScriptedLoopModel(Script(**script)))
