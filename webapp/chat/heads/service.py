"""One head over a whole reply, on the shared core: Inside's checks and context (the same ids the model had,
the same 404s and 409s), the query rows (the reply's positions up to the one that produced the token, or
from the user's message on; the last MAX_ROWS of them), the prompt's regions (its start, few-shot examples,
earlier turns, the user's message, the reply) as positions of that context, a job per request on the
writer's "head" kind, and finished reports kept, a bounded number, under their request, never under a
message id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webapp.chat.heads.jobs import HeadReport, HeadRequest, HeadResult
from webapp.chat.inside.service import InsideService
from webapp.chat.model.prompt import PromptReport
from webapp.chat.records import Message, ReplyDetails
from webapp.chat.registry import Work
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError
from webapp.core import InferenceCore

MAX_ROWS = 64  # query rows worked out and shown: the cost and the page grow with them
ROWS = ("reply", "user")  # where the query rows may start: the reply's start marker, the user's message


@dataclass(frozen=True)
class Region:
    """Positions start..end-1 of the context: "start" (bos), "fewshot", "earlier" (turns before the user's
    message), "user" (the message replied to, with its markers), "reply" (its start marker and tokens), or
    "prompt" (a prompt whose parts could not be read)."""

    kind: str
    start: int
    end: int


class HeadService(ReportJobs[HeadRequest, HeadResult, HeadReport]):
    """What the head views call; knows the core and the Inside service, never the device."""

    def __init__(self, core: InferenceCore, inside: InsideService, keep: int = 32) -> None:
        super().__init__(core, inside.models, Work.HEAD, keep, lambda result: result.report, HeadResult)
        self.inside = inside

    def heads(self, model: str) -> tuple[int, int]:
        """(n_layer, n_head) of a model Inside can look into."""
        config: Any = self.models.get(model).model.config
        return int(config.n_layer), int(config.n_head)

    def request_for(self, model: str, message: Message, details: ReplyDetails, index: int, layer: int,
                    head: int, rows: str = "reply") -> HeadRequest:
        """Layer `layer`, head `head` (both from 0) over token `index`'s context, its query rows from the reply's
        start (`rows` "reply") or from the user's message ("user"), the last MAX_ROWS. Raises ChatError:
        404 (no such token or head), 409 (not finished)."""
        n_layer, n_head = self.heads(model)
        if not (0 <= layer < n_layer and 0 <= head < n_head):
            raise ChatError(f"No head {layer}.{head}: this model has blocks 0 to {n_layer - 1} and heads 0 to "
                            f"{n_head - 1} in each.", 404)
        inside = self.inside.request_for(message, details, index)  # the 404s and 409s, as Inside's
        p = len(inside.context_ids) - 1
        first = p - index  # the position of the reply's start marker (it produced token 0)
        if rows == "user":
            user = [r for r in regions(details.prompt, index, p + 1) if r.kind == "user"]
            first = user[0].start if user else first
        first = max(first, p - MAX_ROWS + 1, 0)
        return HeadRequest(inside.context_ids, index, layer, head, first, inside.steer)



def regions(prompt: dict | None, index: int, positions: int) -> list[Region]:
    """The regions of the context of token `index` (`positions` ids: the prompt, then the reply's tokens
    before it, cut to its last block_size) from the prompt's parts as the Prompt page splits them."""
    full = len((prompt or {}).get("ids") or ()) + index  # the context before the window cut it
    shift = full - positions
    try:
        parts = PromptReport.from_dict(prompt or {}).parts
    except (TypeError, ValueError, KeyError):
        parts = []
    found: list[Region] = []

    def add(kind: str, start: int, end: int) -> None:
        start, end = max(start - shift, 0), min(end - shift, positions)
        if end <= start:
            return
        if found and found[-1].kind == kind and found[-1].end == start:
            start = found.pop().start
        found.append(Region(kind, start, end))

    turns = [p for p in parts if p.kind == "turn"]
    user = turns[-1] if turns and turns[-1].role == "user" else None
    starts = [p for p in parts if p.kind == "reply_start"]
    if not starts or starts[-1].end != full - index:  # not the parts of these ids: one region
        add("prompt", 0, full - index)
    for part in parts if starts and starts[-1].end == full - index else []:
        if part.kind == "bos":
            add("start", part.start, part.end)
        elif part.kind == "fewshot":
            add("fewshot", part.start, part.end)
        elif part.kind == "turn":
            add("user" if part is user else "earlier", part.start, part.end)
        elif part.kind == "reply_start":
            add("reply", part.start, part.end)
    add("reply", full - index, full)
    return found
