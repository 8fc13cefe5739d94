"""Chat replies on the core's worker: the batched decoder, and the one-at-a-time path.

`ChatBatch` is the core's executor for chat on a model with a KV cache (webapp/core/executors.py):
every running reply is a row (a `Sequence`). Each step it retires cancelled rows, runs one prefill
chunk for the oldest newcomer, and one decoding step for every row that is decoding, reading the
weights once for all of them. Each row keeps its own sampling settings, generator, KV cache and text
decoder, so a reply is the same, token for token, as the same reply generated alone.

`ChatAlone` runs a whole reply in one call: for the owner's models without a KV cache (the seed's
full-recompute loop), one at a time as before batching.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

from webapp.chat.generate import Piece, SamplingParams, Sequence, decode_step, generate
from webapp.chat.odds import TokenOdds
from webapp.chat.prefix_cache import prefix_cache_for
from webapp.chat.store import ReplyStats
from webapp.core.executors import Finished, StepReport
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job, JobCancelled
from webapp.core.threads import torch_threads


@dataclass(frozen=True)
class ChatRequest:
    """A reply to generate: the prompt's token ids and the reply's sampling settings."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    odds: bool = True  # record each token's odds (webapp/chat/odds.py)
    forced: tuple[int, ...] = ()  # the reply's first tokens, given (a branch from a token)
    forced_odds: tuple = ()  # their odds where known (TokenOdds or None each)


@dataclass(frozen=True)
class Forced:
    """The first tokens of a reply branched from another version's token: kept tokens, then the pick."""

    tokens: tuple[int, ...]
    odds: tuple = ()


def publish(job: Job, piece: Piece, core) -> None:
    """One generated piece to its job: text for the stream and the saved reply, and the stats so far."""
    if piece.token is not None:
        job.result["token_ids"].append(piece.token)
        job.result["odds"].append(piece.odds or TokenOdds.given(piece.token))  # one row per token
        # every token is an event, text or not (a byte inside a character): the page shows tokens too
        job.keep("token", text=piece.text, index=piece.tokens - 1, token=piece.token, odds=piece.odds)
    elif piece.text:  # the text the decoder held back, flushed at the end
        job.keep("token", text=piece.text, index=None, token=None, odds=None)
    if piece.text:
        job.result["text"].append(piece.text)
    s = piece.stats
    if s is not None:  # the last piece: the generator's own figures
        job.result["stats"] = ReplyStats(s.new_tokens, s.time_to_first_token_s, s.decode_tokens_per_s)
    elif piece.tokens:
        core.count("tokens", 1, job)
        job.result.setdefault("first", piece.elapsed_s)
        job.result["stats"] = _stats_so_far(job.result["first"], piece.elapsed_s, piece.tokens)
        job.progress()  # saves the reply so far now and then (Job.on_progress): kill -9 keeps what was seen


def _stats_so_far(first: float, elapsed: float, tokens: int) -> ReplyStats:
    """Figures kept for a reply that is stopped before the generator's own stats."""
    rate = (tokens - 1) / (elapsed - first) if tokens > 1 and elapsed > first else None
    return ReplyStats(tokens=tokens, ttft_seconds=first, tokens_per_second=rate)


class ChatBatch:
    """The batched executor: running replies are rows, stepped together."""

    batched = True

    def __init__(self, loaded, max_rows: int, kv_cache_bytes: int) -> None:
        self.loaded, self.max_rows = loaded, max_rows
        # Finished replies' caches, kept for their conversations' next turns under a budget.
        self.prefix = prefix_cache_for(loaded.model)
        self.prefix.budget_bytes = kv_cache_bytes
        self._rows: dict[str, tuple[Job, Sequence]] = {}  # in order of admission

    @property
    def rows(self) -> int:
        return len(self._rows)

    def memory_bytes(self) -> int:
        return sum(seq.cache_bytes for _, seq in self._rows.values()) + self.prefix.nbytes

    def admit(self, job: Job) -> None:
        request: ChatRequest = job.request
        job.result.update(text=[], token_ids=[], odds=[])
        self._rows[job.id] = (job, Sequence(self.loaded, request.prompt_ids, request.params, self.prefix,
                                            odds=request.odds, forced=request.forced,
                                            forced_odds=request.forced_odds))

    def step(self, core) -> StepReport:
        report, errors = StepReport(), {}
        rows = list(self._rows.values())
        for job, seq in rows:
            if job.cancelled:
                seq.cancel()
        with torch_threads(self.loaded.torch_threads):
            newcomer = next(((job, seq) for job, seq in rows if seq.prefilling), None)
            if newcomer is not None:
                try:
                    report.prefill_tokens = newcomer[1].prefill_chunk()
                except Exception as exc:  # this prompt failed; the others go on
                    errors[newcomer[0].id] = _message(exc)
                for piece in newcomer[1].drain():  # its first token now, not after the decode step
                    publish(newcomer[0], piece, core)
            decoding = [(job, seq) for job, seq in rows if seq.decoding and job.id not in errors]
            if decoding:
                try:
                    decode_step(self.loaded.model, [seq for _, seq in decoding])
                    report.rows = len(decoding)
                except Exception as exc:  # the step failed for every row in it
                    errors.update({job.id: _message(exc) for job, _ in decoding})
        for job, seq in rows:
            for piece in seq.drain():
                publish(job, piece, core)
            if seq.finished or job.id in errors:
                report.finished.append(self._retire(job, seq, errors.get(job.id), core))
        return report

    def _retire(self, job: Job, seq: Sequence, error: str | None, core) -> Finished:
        del self._rows[job.id]
        publish(job, seq.close(keep=error is None), core)
        if error is not None:
            return Finished(job, FAILED, error)
        return Finished(job, CANCELLED if seq.stop_reason == "cancelled" else DONE)


class ChatAlone:
    """The whole-reply executor, for models without a KV cache: one reply at a time."""

    batched = False

    def __init__(self, loaded) -> None:
        self.loaded = loaded

    def run(self, job: Job, core) -> None:
        request: ChatRequest = job.request
        job.result.update(text=[], token_ids=[], odds=[])
        p = request.params
        pieces = generate(self.loaded, request.prompt_ids, max_new_tokens=p.max_new_tokens,
                          temperature=p.temperature, top_k=p.top_k, seed=p.seed,
                          should_stop=lambda: job.cancelled, odds=request.odds)
        with torch_threads(self.loaded.torch_threads), closing(pieces):
            for piece in pieces:
                publish(job, piece, core)
        if job.cancelled:  # the generator stopped early: say so
            raise JobCancelled()


def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
