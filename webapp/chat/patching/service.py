"""Activation patching on the shared core: build a job's request from what a reply saved (its exact prompt,
its tokens) and the user's edit of the last user message, check it, submit it (or join the one already
running), and keep finished maps, a bounded number, least recently used forgotten first, under their
request (the two contexts and the two tokens), not under a message id."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, cast

from webapp.chat.inside.service import InsideService
from webapp.chat.patching.compute import Patching, first_difference
from webapp.chat.patching.jobs import PatchingRequest, PatchingResult
from webapp.chat.records import Message, ReplyDetails
from webapp.chat.registry import Work
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError
from webapp.core import InferenceCore


class PatchingService(ReportJobs[PatchingRequest, PatchingResult, Patching]):
    """What the patching views call; knows the core and Inside's checks (who wrote a reply, whether its
    model can be looked into, the token's context), never the device."""

    def __init__(self, core: InferenceCore, inside: InsideService, keep: int = 32, max_cells: int = 4096) -> None:
        super().__init__(core, inside.models, Work.PATCHING, keep, lambda result: result.patching, PatchingResult)
        self.inside = inside
        self.max_cells = max_cells  # GLASSBOX_PATCHING_MAX_CELLS
        # the maps a presenter opened, by a short name their followers' twin is reached at (issue 51): the edited
        # message may be thousands of characters, more than a follow link's state holds
        self._named: OrderedDict[str, tuple[str, PatchingRequest, str]] = OrderedDict()
        self._named_keep = max(4 * keep, 16)
        self._lock = threading.Lock()

    def name(self, model: str, request: PatchingRequest, corrupted: str) -> str:
        """A short name for this map (the same request, the same name), by which `named` finds it again."""
        key = hashlib.sha256(repr((model, request)).encode()).hexdigest()[:16]
        with self._lock:
            self._named[key] = (model, request, corrupted)
            self._named.move_to_end(key)
            while len(self._named) > self._named_keep:
                self._named.popitem(last=False)
        return key

    def named(self, key: str) -> tuple[str, PatchingRequest, str] | None:
        """(model, request, the edited message) of a map named here; None: never, or forgotten since."""
        with self._lock:
            return self._named.get(key)

    def last_user_message(self, details: ReplyDetails) -> str | None:
        """The text of the last user message the reply's prompt holds (what the form starts from)."""
        part = _last_user_part(details.prompt or {})
        return None if part is None else part["text"]

    def request_for(self, message: Message, details: ReplyDetails, index: int, corrupted: object,
                    against: object, estimate: object = False) -> PatchingRequest:
        """Token `index` of a reply, against token `against`, with its last user message replaced by
        `corrupted`; with `estimate`, the map's first-order estimate alone (no cell cap: it costs a backward
        pass however many cells). Raises ChatError: 404 (no such token), 409 (not here, not finished), 400
        (bad input, contexts of different lengths)."""
        clean = self.inside.request_for(message, details, index)  # the 404s and 409s, as Inside's
        loaded = self.inside.models.get(self.inside.writer(message))
        if not isinstance(corrupted, str) or not corrupted.strip():
            raise ChatError("Give the last user message as it would be (a non-empty string, `corrupted`).", 400)
        if isinstance(against, bool) or not isinstance(against, int):
            raise ChatError("Give the alternative token as a token id (an integer, `against`).", 400)
        vocab = min(loaded.tokenizer.n_vocab, cast(Any, loaded.model).config.vocab_size)
        if not 0 <= against < vocab:
            raise ChatError(f"No token {against}: this model's tokens are 0 to {vocab - 1}.", 400)
        if not isinstance(estimate, bool):
            raise ChatError("Give `estimate` as true (the first-order estimate alone) or false (the exact map).", 400)
        if against == clean.token:
            raise ChatError("The alternative must be another token than the one the reply has here.", 400)
        prompt = details.prompt or {}
        part = _last_user_part(prompt)
        if part is None:
            raise ChatError("This reply's prompt has no user message to edit.", 400)
        ids = list(prompt["ids"])
        edited = ids[:part["start"]] + loaded.prompt.encode_turn("user", corrupted) + ids[part["end"]:]
        reply = [row[0] for row in details.odds or []][:index]
        clean_full, corrupted_full = ids + reply, edited + reply
        if len(clean_full) != len(corrupted_full):
            raise ChatError(
                f"The two contexts must have the same number of tokens: the reply's own has {len(clean_full)}, "
                f"the edited one {len(corrupted_full)} (the message is {part['end'] - part['start'] - 2} tokens, "
                f"the edit {len(loaded.tokenizer.encode_ordinary(corrupted))}). Edit it so it keeps its length "
                "in tokens.", 400)
        corrupted_ids = tuple(corrupted_full[-loaded.block_size:])  # the same window as the reply's own
        first = first_difference(clean.context_ids, corrupted_ids)
        if first is None:
            raise ChatError("The edited message gives the model the same tokens as the reply's own.", 400)
        config: Any = loaded.model.config
        cells = (config.n_layer + 1) * (len(corrupted_ids) - first) + config.n_layer * config.n_head
        if self.max_cells and cells > self.max_cells and not estimate:
            raise ChatError(f"This would patch {cells} cells, more than this server runs in one job "
                            f"({self.max_cells}, GLASSBOX_PATCHING_MAX_CELLS): pick a token nearer the "
                            "start of the reply, or ask for the estimate alone.", 400)
        return PatchingRequest(clean.context_ids, corrupted_ids, clean.token, against, index, estimate)



def _last_user_part(prompt: dict) -> dict | None:
    return next((p for p in reversed(prompt.get("parts", [])) if p["kind"] == "turn" and p["role"] == "user"), None)
