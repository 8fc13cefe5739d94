"""The chat models this server runs: their registry (GLASSBOX_CHAT_MODELS, a TOML file with one table per
model, the first the default), each entry turned into the settings its model loads and runs with.

    [models.tiny]                      # the name users see: the picker, a reply's label, /v1's "model"
    checkpoint = "models/chat/model.safetensors"
    [models.gpt2-254m]
    checkpoint = "/models/chat_254m.pt"
    arch = "gpt2-254m"
    tokenizer = "gpt2"
    dtype = "bfloat16"

Without the file, the single-model settings (GLASSBOX_CHAT_CHECKPOINT, …) make a registry of one, named
DEFAULT_NAME. A file that cannot be used stops start-up with a ConfigError naming the file, the table
and the key. Relative paths in the file are taken from the file's own folder.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.records import Message
from webapp.config import LIMITS, ConfigError, Settings

DEFAULT_NAME = "glassbox"  # the one model's name when no registry is given (what /v1 always called it)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # safe in a URL, a form value and a label
# A table's keys -> the Settings fields they set, for that model alone. Everything else is the server's.
KEYS = {
    "checkpoint": "chat_checkpoint",
    "arch": "chat_arch",
    "tokenizer": "chat_tokenizer",
    "factory": "chat_factory",
    "dictionaries": "chat_dictionaries",
    "dtype": "dtype",
    "torch_threads": "chat_torch_threads",
    "backend": "chat_backend",
    "backend_model": "chat_backend_model",
    "backend_key_file": "chat_backend_key_file",
    "backend_timeout": "chat_backend_timeout",
    "backend_wait_seconds": "chat_backend_wait_seconds",
    "backend_retry_seconds": "chat_backend_retry_seconds",
    "backend_max_replies": "chat_backend_max_replies",
    "backend_slots": "chat_backend_slots",
}
PATH_KEYS = ("checkpoint", "backend_key_file")



class Work(StrEnum):
    """What a job on a chat model does: its replies, or one experiment (webapp/chat/experiments.py). With the
    model's name it makes the core's job kind (ChatModels.job_kind)."""

    CHAT = "chat"
    INSIDE = "inside"
    ABLATE = "ablate"
    ATTRIBUTION = "attribution"
    HEAD = "head"
    PATCHING = "patching"
    LENS = "lens"
    DIRECTION = "direction"  # a steering direction from two lists of prompts
    FEATURES = "features"  # the sparse dictionaries' features at a token
    FEATURE_TEXT = "feature-text"  # the features of every token of a typed text
    TRAIN = "train"  # a sparse dictionary trained from the page


@dataclass(frozen=True)
class ModelEntry:
    """One chat model of the registry: its name and the settings it loads and runs with."""

    name: str
    settings: Settings


def model_entries(settings: Settings) -> list[ModelEntry]:
    """The registry's entries, in order (the first is the default). Raises ConfigError."""
    if not settings.chat_models:
        return [ModelEntry(DEFAULT_NAME, settings)]
    return read_registry(Path(settings.chat_models), settings)


def read_registry(path: Path, base: Settings) -> list[ModelEntry]:
    where = f"GLASSBOX_CHAT_MODELS={path}"
    try:
        document = tomllib.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"{where}: cannot read the file ({error.strerror or error})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{where}: not valid TOML ({error})") from None
    unknown = sorted(set(document) - {"models"})
    if unknown:
        raise ConfigError(f"{where}: unknown table [{unknown[0]}]; models go in [models.<name>] tables")
    tables = document.get("models")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{where}: no models; give at least one [models.<name>] table with a checkpoint")
    entries = []
    for name, table in tables.items():
        here = f"{where}, [models.{name}]"
        if not NAME.fullmatch(name):
            raise ConfigError(f"{here}: a model's name is 1 to 64 letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit")
        if not isinstance(table, dict):
            raise ConfigError(f"{here}: must be a table of settings (checkpoint = \"…\", …)")
        entries.append(ModelEntry(name, _entry_settings(table, base, path.parent, here)))
    return entries


def _entry_settings(table: dict[str, Any], base: Settings, folder: Path, here: str) -> Settings:
    if "checkpoint" not in table:
        raise ConfigError(f"{here}: no checkpoint; give the model's file (checkpoint = \"path/model.safetensors\")")
    types = {f.name: type(f.default) for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    value: Any
    for key, value in table.items():
        field = KEYS.get(key)
        if field is None:
            raise ConfigError(f"{here}, key {key!r}: unknown; a model takes {', '.join(sorted(KEYS))}")
        kind = types[field]
        if key == "dictionaries" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(str(folder / Path(v).expanduser()) for v in value) or "none"
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise ConfigError(f"{here}, key {key!r}: expected {_kind_name(kind)}, got {value!r}")
        limit = LIMITS.get(field)  # checked as its GLASSBOX_* twin is
        if limit is not None and isinstance(value, (int, float)) and not limit.allows(value):
            raise ConfigError(f"{here}, key {key!r}: {value!r} is out of range: use {limit.says()}")
        if key in PATH_KEYS and value:
            value = str(folder / Path(str(value)).expanduser())  # an absolute path stays as it is
        values[field] = value
    return dataclasses.replace(base, **{**_single_model_fields(), **values})


def _single_model_fields() -> dict[str, Any]:
    """The per-model settings at their defaults: a registry's model takes nothing of GLASSBOX_CHAT_CHECKPOINT
    and friends (one model's tokenizer must not leak into another's)."""
    defaults = Settings()
    return {field: getattr(defaults, field) for field in KEYS.values()}


def _kind_name(kind: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(kind, kind.__name__)


@dataclass(frozen=True)
class ModelRecord:
    """Who wrote a reply, as the reply keeps it: the registry name, the checkpoint's file id, the precision."""

    name: str
    file_id: str
    precision: str


class ChatModels:
    """The loaded chat models by registry name, in the registry's order; the first is the default. Each
    runs as its own kinds of job on the core (`job_kind`: its replies, Inside, attribution, ablation,
    patching): its replies step in a batch of their own, the worker stepping every model that has rows."""

    def __init__(self, loaded: dict[str, LoadedChatModel], settings: dict[str, Settings] | None = None) -> None:
        self._loaded = dict(loaded)
        self._settings = dict(settings or {})

    @classmethod
    def one(cls, loaded: LoadedChatModel, name: str = DEFAULT_NAME) -> ChatModels:
        return cls({name: loaded})

    def __bool__(self) -> bool:
        return bool(self._loaded)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded

    def names(self) -> list[str]:
        return list(self._loaded)

    @property
    def default(self) -> str:
        if not self._loaded:
            raise KeyError("this server runs no chat model")
        return next(iter(self._loaded))

    def get(self, name: str | None = None) -> LoadedChatModel:
        """The model of that name (None: the default). Raises KeyError."""
        return self._loaded[self.default if name is None else name]

    def settings_for(self, name: str, base: Settings) -> Settings:
        return self._settings.get(name, base)

    def job_kind(self, work: Work, name: str) -> str:
        """The core's job kind for one kind of work on this model: the default model keeps the plain name,
        another adds its own ("inside:second"), so each model's jobs have executors of their own."""
        return str(work) if name == self.default else f"{work}:{name}"

    def kind(self, name: str) -> str:
        """The core's job kind for this model's replies."""
        return self.job_kind(Work.CHAT, name)

    def card(self, name: str | None = None) -> ModelCard:
        name = self.default if name is None else name
        return model_card(name, self._loaded[name])

    def record(self, name: str) -> ModelRecord:
        loaded = self._loaded[name]
        return ModelRecord(name, loaded.checkpoint_id, loaded.precision)

    def unavailable_reason(self, message: Message) -> str | None:
        """`unavailable` for a saved message (what a reply's label says)."""
        return self.unavailable(model_record(message))

    def running(self, record: ModelRecord | None) -> str | None:
        """The name this server runs the model that wrote a reply under (None: it does not run it). A model is
        its file and precision: the same file under a new name (a registry written since) is the same
        model; another file under the same name is not. A reply saved before replies kept their model
        (None) is the default model's, as it was before."""
        if record is None:
            return self.default
        same = [name for name in self._loaded if (self.record(name).file_id, self.record(name).precision)
                == (record.file_id, record.precision)]
        return record.name if record.name in same else next(iter(same), None)

    def now_named(self, message: Message) -> str | None:
        """The name a reply's model runs under now, where it is not the name the reply was saved with."""
        record = model_record(message)
        name = self.running(record) if record else None
        return name if record and name and name != record.name else None

    def unavailable(self, record: ModelRecord | None) -> str | None:
        """Why the model that wrote a reply cannot run here now (None: it can, under `running`'s name)."""
        if record is None or self.running(record) is not None:
            return None
        if record.name not in self._loaded:
            return f"This reply was written by {record.name}, which this server does not run."
        now = self.record(record.name)
        if now.file_id != record.file_id or now.precision != record.precision:
            return (f"This reply was written by {record.name} from {record.file_id} at {record.precision}; this "
                    f"server now runs {record.name} from {now.file_id} at {now.precision}, so its numbers would "
                    "be another model's.")
        return None


def model_record(message: Message) -> ModelRecord | None:
    """Who wrote a reply, as it was saved; None for a question, or a reply saved before replies kept it."""
    if not message.is_reply or not message.model:
        return None
    return ModelRecord(message.model, message.model_file or "", message.model_precision or "")


@dataclass(frozen=True)
class ModelCard:
    """What the chat page says of a model: its size and shape, window, tokenizer, precision and file."""

    name: str
    parameters: int
    layers: int | None
    heads: int | None
    width: int | None
    window: int
    tokenizer: str
    precision: str
    file_id: str
    remote: bool


def model_card(name: str, loaded: LoadedChatModel) -> ModelCard:
    config = getattr(loaded.model, "config", None)
    parameters = loaded.n_params or sum(p.numel() for p in loaded.model.parameters())
    return ModelCard(name, parameters, getattr(config, "n_layer", None), getattr(config, "n_head", None),
                     getattr(config, "n_embd", None), loaded.block_size, loaded.tokenizer.name, loaded.precision,
                     loaded.checkpoint_id, loaded.remote)
