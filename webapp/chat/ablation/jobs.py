"""Switching parts off, on the core's worker: the work an ablation needs before or beside a reply's run.

An ablated reply is an ordinary reply whose ChatRequest carries an Edit (the batched decoder runs it as a
row of its own; webapp/chat/decode/generate.py keeps its KV cache out of the prefix cache). What needs the
model first runs here, as whole jobs between the replies' steps (like Inside), reading the model and
writing nothing:

- the means of a mean ablation: one clean forward of the context (webapp/chat/ablation/compute.py);
- one position with parts switched off: the odds at the context's last position, clean and edited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from webapp.chat.ablation.compute import Parts, clean_run, zero_edit
from webapp.chat.decode.reply_jobs import ReplyJobs
from webapp.chat.inside.compute import lens_logits, look_inside
from webapp.chat.model.edits import Edit
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import Worker
from webapp.core.jobs import Job

TOP = 10  # tokens shown on each side of a position's odds


@dataclass(frozen=True)
class AblationRequest:
    """The ids at positions 0..T-1 a run starts from and what to switch off. position False: the run's edit
    (the means, for a mean ablation); True: also the odds at position T-1 with and without it, and the odds
    of `token` (the token the reply has there)."""

    context_ids: tuple[int, ...]
    parts: Parts
    position: bool = False
    token: int | None = None


@dataclass(frozen=True)
class Odds:
    """Odds at one position (softmax at temperature 1 over the whole vocabulary, as the token panel's)."""

    top: tuple[tuple[int, float], ...]  # (id, probability), most likely first
    token_probability: float | None  # of the reply's token there
    token_rank: int | None  # 1: the most likely


@dataclass
class AblationResult:
    edit: Edit | None = None
    clean: Odds | None = None
    edited: Odds | None = None


def odds_of(logits: torch.Tensor, token: int | None, top: int = TOP) -> Odds:
    """logits (V,) -> the top tokens and the token's probability and rank (ranked by strictly greater logits)."""
    probs = torch.softmax(logits.float(), dim=-1)
    p, ids = probs.topk(min(top, probs.numel()))
    if token is None:
        return Odds(tuple(zip(ids.tolist(), p.tolist())), None, None)
    rank = int((logits > logits[token]).sum()) + 1
    return Odds(tuple(zip(ids.tolist(), p.tolist())), float(probs[token]), rank)


def ablation_result(loaded: LoadedChatModel, request: AblationRequest,
                    between: Callable[[], None] | None = None) -> AblationResult:
    model: Any = loaded.model  # nanoGPT's layout (checked before the job: AblationService.unavailable)
    parts, ids = request.parts, list(request.context_ids)
    n_head = model.config.n_head
    needs_clean = parts.mode == "mean" or request.position
    clean = clean_run(model, ids, parts, between) if needs_clean else None
    edit = clean.mean_edit() if clean is not None and parts.mode == "mean" else zero_edit(parts, n_head)
    if not request.position:
        return AblationResult(edit)
    assert clean is not None
    device = model.transformer.wte.weight.device
    with torch.inference_mode():
        inside = look_inside(model, torch.tensor([ids], dtype=torch.long, device=device), edit=edit, between=between)
        edited = lens_logits(model, inside.residuals[-1:])[0].float()  # (V,)
    return AblationResult(edit, odds_of(clean.logits, request.token), odds_of(edited, request.token))


class AblationJobs(ReplyJobs[AblationRequest, AblationResult]):
    """The core's executor for ablation jobs (it reads no kept cache)."""

    def work(self, request: AblationRequest, between: Callable[[], None],
             job: Job[AblationRequest, AblationResult], core: Worker) -> AblationResult:
        return ablation_result(self.loaded, request, between)
