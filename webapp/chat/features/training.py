"""Training a dictionary from the page, on the shared core: the request checked here, the corpus an uploaded file
kept in the instance folder, the job a whole job on the core's worker (webapp/chat/features/training_jobs.py)
that lets replies step after every training step and stops there when asked; its progress is published as
events. The finished dictionary is written into the instance folder (dictionaries/<model>/<name>) and loaded
beside the model at once, and again at every start."""

from __future__ import annotations

import logging
import re
import shutil
import uuid
from pathlib import Path

from webapp.chat.features.dictionaries import load_dictionaries
from webapp.chat.features.saelens import CFG
from webapp.chat.features.train import STATE
from webapp.chat.features.training_jobs import TrainRequest, TrainResult
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.registry import ChatModels, Work
from webapp.chat.service import ChatError
from webapp.core import InferenceCore
from webapp.core.jobs import Job, JobState

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_CORPUS_BYTES = 64 * 2**20
# A dictionary trained from the page is a whole job holding the core's worker (replies step between its steps,
# other whole jobs wait): bounded here; larger ones are the command line's (python -m webapp.features train).
MAX_WIDTH = 16_384
MAX_TOKENS = 2_000_000
SUFFIXES = (".txt", ".jsonl")

log = logging.getLogger("glassbox")


class TrainingService:
    """What the dictionary pages call; knows the core and the models, never the device."""

    def __init__(self, core: InferenceCore, models: ChatModels, instance: Path) -> None:
        self.core, self.models, self.instance = core, models, instance
        self.load_trained()

    def load_trained(self) -> None:
        """The dictionaries trained on the page before this start, loaded beside their models again: each finished
        folder of instance/dictionaries/<model>/ (one whose training was cut short still holds its training state,
        and is left alone). One that no longer fits its model (the model changed under its name), or whose name a
        configured dictionary has, is skipped with a warning in the log: it stops nothing."""
        for model in self.models.names():
            loaded, folder = self.models.get(model), self.instance / "dictionaries" / model
            if getattr(loaded, "remote", False) or not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if not (path / CFG).is_file() or (path / STATE).exists():
                    continue
                if path.name in (loaded.dictionaries or {}):
                    log.warning("dictionary %s not loaded: model %s already has one named %r", path, model, path.name)
                    continue
                try:
                    found = load_dictionaries(str(path), "", loaded.model, loaded.tokenizer)
                except ModelLoadError as error:
                    log.warning("dictionary %s not loaded for model %s: %s", path, model, error)
                    continue
                loaded.dictionaries = {**(loaded.dictionaries or {}), **found}

    def request(self, model: object, fields: dict[str, str], corpus_name: str, corpus: bytes) -> tuple[str,
                                                                                                       TrainRequest]:
        """(model, request) from the form, the corpus saved. Raises ChatError: 400 (a field, the corpus), 409 (a
        model that cannot be trained on here, a name taken)."""
        if not isinstance(model, str) or model not in self.models:
            raise ChatError(f"model must be one of this server's chat models: {', '.join(self.models.names())}.", 400)
        loaded = self.models.get(model)
        if getattr(loaded, "remote", False):
            raise ChatError("This model's replies come from a remote server: there is no residual stream here to "
                            "train a dictionary on.", 409)
        config = getattr(loaded.model, "config", None)
        n_layer = getattr(config, "n_layer", 0)
        name = fields.get("name", "").strip()
        if not NAME.fullmatch(name):
            raise ChatError("name must be 1 to 64 letters, digits, '_', '-' or '.', starting with a letter or digit.",
                            400)
        if name in (loaded.dictionaries or {}):
            raise ChatError(f"This model already has a dictionary named {name!r}.", 409)
        numbers = {}
        for field, low, high in (("layer", 0, n_layer - 1), ("width", 2, MAX_WIDTH), ("k", 1, MAX_WIDTH),
                                 ("tokens", 512, MAX_TOKENS)):
            try:
                numbers[field] = int(fields.get(field, ""))
            except ValueError:
                raise ChatError(f"{field} must be a whole number.", 400) from None
            if not low <= numbers[field] <= high:
                raise ChatError(f"{field} must be from {low:,} to {high:,}.", 400)
        if numbers["k"] > numbers["width"]:
            raise ChatError("k must be at most the width.", 400)
        suffix = Path(corpus_name).suffix
        if suffix not in SUFFIXES:
            raise ChatError("The corpus is a .txt file (one document a line) or a .jsonl file of chat exchanges.", 400)
        if not corpus.strip():
            raise ChatError("The corpus is empty.", 400)
        if len(corpus) > MAX_CORPUS_BYTES:
            raise ChatError(f"The corpus is larger than {MAX_CORPUS_BYTES // 2**20} MiB.", 400)
        try:
            corpus.decode("utf-8")
        except UnicodeDecodeError:
            raise ChatError("The corpus is not UTF-8 text.", 400) from None
        out = self.instance / "dictionaries" / model / name
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            out.mkdir()  # claimed: two jobs of one name never write into one folder
        except FileExistsError:
            raise ChatError(f"A dictionary {name!r} is being trained, or was, for this model: choose another name.",
                            409) from None
        folder = self.instance / "corpora"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{uuid.uuid4().hex}{suffix}"
        path.write_bytes(corpus)
        return model, TrainRequest(name, numbers["layer"], numbers["width"], numbers["k"], numbers["tokens"], str(path),
                                   str(out))

    def start(self, owner: str, model: str, request: TrainRequest) -> Job[TrainRequest, TrainResult]:
        """The training job. Raises Refused (queue full, too many jobs for this browser or address)."""
        job: Job[TrainRequest, TrainResult] = Job(self.models.job_kind(Work.TRAIN, model), owner, request,
                                                  result=TrainResult(), on_finish=_clean_up)
        try:
            return self.core.submit(job)
        except BaseException:
            _clean_up(job, JobState.FAILED, None)
            raise


def _clean_up(job: Job[TrainRequest, TrainResult], outcome: JobState, error: str | None) -> None:
    """Whatever the outcome, the upload goes; a dictionary not finished goes too (its name is free again)."""
    Path(job.request.corpus).unlink(missing_ok=True)
    if outcome != JobState.DONE:
        shutil.rmtree(job.request.out, ignore_errors=True)
