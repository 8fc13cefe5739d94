"""Training a dictionary as a job on the core's worker (webapp/chat/features/train.py does the work): one step at
a time, replies stepping in between, each step's progress published (`progress` events), stopped at the next
step when asked (the last step kept on disk). At the end: the figures on held-out text and each feature's top
contexts, written beside it, and the dictionary loaded beside the model."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from webapp.chat.decode.reply_jobs import ReplyJobs
from webapp.chat.features import contexts
from webapp.chat.features.activations import corpus_files, documents, sequences
from webapp.chat.features.dictionaries import load_dictionaries
from webapp.chat.features.quality import quality
from webapp.chat.features.sae import Dictionary
from webapp.chat.features.train import STATE, Plan, Progress, train
from webapp.core.executors import Worker
from webapp.core.jobs import Job

CONTEXT_SEQUENCES = 128  # sequences read for the features' top contexts after training from the page


@dataclass(frozen=True)
class TrainRequest:
    name: str  # the dictionary's name (its folder)
    layer: int
    width: int
    k: int
    tokens: int
    corpus: str  # the uploaded corpus, in the instance folder
    out: str  # the dictionary's folder


@dataclass
class TrainResult:
    progress: Progress | None = None  # the latest step's
    figures: dict[str, float] | None = None  # on held-out text, once trained


class TrainJobs(ReplyJobs[TrainRequest, TrainResult]):
    """The core's executor for training dictionaries from the page."""

    def work(self, request: TrainRequest, between: Callable[[], None], job: Job[TrainRequest, TrainResult],
             core: Worker) -> TrainResult:
        loaded = self.loaded
        result = job.result = TrainResult()
        plan = Plan((request.layer,), request.width, request.k, request.tokens, batch=min(4096, request.tokens),
                    eval_sequences=16)

        def report(progress: Progress) -> None:
            result.progress = progress
            job.emit("progress", progress)

        corpus, out = Path(request.corpus), Path(request.out)
        (sae,) = train(loaded.model, loaded.prompt, corpus, plan, out, request.name, report=report,
                       between=between).values()
        if not (out / "cfg.json").exists() or torch.load(out / STATE, weights_only=False)["step"] == 0:
            raise ValueError(f"the corpus ran out before the first step: it needs more than "
                             f"{plan.eval_sequences} sequences of {plan.context} tokens")
        return self._finish(request, result, plan, sae, corpus, out)

    def _finish(self, request: TrainRequest, result: TrainResult, plan: Plan, sae: Dictionary, corpus: Path,
                out: Path) -> TrainResult:
        """The figures and contexts written beside the dictionary, and the dictionary loaded beside the model."""
        loaded = self.loaded
        seqs = list(itertools.islice(sequences(documents(corpus_files(corpus), loaded.prompt), plan.context),
                                     max(plan.eval_sequences, CONTEXT_SEQUENCES)))
        figures = quality(loaded.model, sae, seqs[:plan.eval_sequences])
        result.figures = {**asdict(figures), "loss_recovered": figures.loss_recovered}
        (out / "quality.json").write_text(json.dumps(result.figures, indent=2) + "\n")
        contexts.save(contexts.feature_contexts(loaded.model, sae, seqs), out)
        (out / "glassbox_training.pt").unlink(missing_ok=True)
        found = load_dictionaries(str(out), "", loaded.model, loaded.tokenizer)
        loaded.dictionaries = {**(loaded.dictionaries or {}), **found}  # one assignment: readers see old or new
        return result
