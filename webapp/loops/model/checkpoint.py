"""Save and load Loop-lab model bundles.

A bundle directory holds two files:
  model.safetensors  the LoopTransformer weights
  config.json        {"format", "prompt_format", "model": LoopConfig fields,
                      "tokenizer": {"type": "char", "vocab": [...]}, "training": {...}}

`load_bundle(spec)` takes such a directory, or "module:function" naming an
owner's factory that returns a LoopBundle-like object or a dict with the same
five keys. Every failure is a LoopModelError naming the file or spec.
"""

import hashlib
import importlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from webapp.config import ROOT
from webapp.loops.model.latent import model_class
from webapp.loops.model.looped import LoopConfig, LoopTransformer
from webapp.loops.model.tokenizer import CharTokenizer
from webapp.loops.task import PROMPT_FORMAT, render_prompt

BUNDLE_FORMAT = "glassbox-loops/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"
DEFAULT_BUNDLE = ROOT / "models" / "loops"


class LoopModelError(Exception):
    """The Loop-lab model could not be loaded; the message names the file or spec."""


@dataclass
class LoopBundle:
    model: Any                      # called as model(input_ids=..., num_loops=..., ...)
    tokenizer: Any                  # tok(text, add_special_tokens=False, return_tensors="pt")
    readout_token_ids: list[int]    # ids of A..Z, in order
    checkpoint_id: str
    render_prompt: Callable[[Any, str, int], str]
    trained_k: list[int] | None = None  # [lo, hi]: the loops (hops) its training ran, where known


OPTIONAL = ("trained_k",)  # what an owner's factory may leave out


def trained_range(training: dict) -> list[int] | None:
    """A bundle's trained k from its config's training record: the latent model's trained_k, or the
    bundled model's curriculum level (k from 1 to it)."""
    value = training.get("trained_k")
    if isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
        return value
    level = training.get("final_level")
    return [1, level] if type(level) is int else None


def save_bundle(model: LoopTransformer, tokenizer: CharTokenizer, directory, training: dict) -> str:
    """Write weights and config; return the checkpoint id the bundle will load as."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS))
    config = {"format": BUNDLE_FORMAT, "prompt_format": PROMPT_FORMAT,
              "model": asdict(model.config),
              "tokenizer": {"type": "char", "vocab": list(tokenizer.vocab)},
              "training": training}
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return _checkpoint_id(directory)


def _checkpoint_id(directory: Path) -> str:
    digest = hashlib.sha256((directory / WEIGHTS).read_bytes()).hexdigest()[:12]
    return f"bundled:{directory.name}@{digest}"


def load_bundle(path_or_spec=None) -> LoopBundle:
    """Load a bundle directory (default: models/loops) or call a "module:function" factory."""
    spec = str(DEFAULT_BUNDLE if path_or_spec is None else path_or_spec)
    if ":" in spec and not os.path.isdir(spec):
        return _from_factory(spec)
    return _from_directory(Path(spec))


def _from_directory(directory: Path) -> LoopBundle:
    if not directory.is_dir():
        raise LoopModelError(f"Loop model directory {directory} does not exist")
    config_path, weights_path = directory / CONFIG, directory / WEIGHTS
    for path in (config_path, weights_path):
        if not path.is_file():
            raise LoopModelError(f"Loop model file {path} is missing")
    try:
        config = json.loads(config_path.read_text())
        if config.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"format is {config.get('format')!r}, expected {BUNDLE_FORMAT!r}")
        if config.get("prompt_format") != PROMPT_FORMAT:
            raise ValueError(f"prompt_format is {config.get('prompt_format')!r}, "
                             f"this code renders {PROMPT_FORMAT!r}")
        known = {f.name for f in fields(LoopConfig)}
        unknown = set(config["model"]) - known
        if unknown:
            raise ValueError(f"unknown model fields {sorted(unknown)}")
        model_config = LoopConfig(**config["model"])
        architecture = model_class(model_config)
        tokenizer = CharTokenizer(config["tokenizer"]["vocab"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise LoopModelError(f"Loop model config {config_path} is invalid: {error}") from error
    if tokenizer.vocab_size != model_config.vocab_size:
        raise LoopModelError(f"Loop model config {config_path} is invalid: tokenizer has "
                             f"{tokenizer.vocab_size} tokens, model expects {model_config.vocab_size}")
    if tokenizer.readout_token_ids != list(model_config.readout_token_ids):
        raise LoopModelError(f"Loop model config {config_path} is invalid: readout ids "
                             "disagree between tokenizer and model")
    model = architecture(model_config)
    try:
        model.load_state_dict(load_file(str(weights_path)), strict=True)
    except Exception as error:  # safetensors header errors, missing keys, shape mismatches
        raise LoopModelError(f"Loop model weights {weights_path} do not fit the config: {error}") from error
    model.eval()
    return LoopBundle(model=model, tokenizer=tokenizer,
                      readout_token_ids=list(tokenizer.readout_token_ids),
                      checkpoint_id=_checkpoint_id(directory), render_prompt=render_prompt,
                      trained_k=trained_range(config.get("training") or {}))


def _from_factory(spec: str) -> LoopBundle:
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise LoopModelError(f"Loop model spec {spec!r} must look like module:function")
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise LoopModelError(f"Loop model factory {spec!r} is not importable: {error}") from error
    try:
        made = factory()
    except Exception as error:
        raise LoopModelError(f"Loop model factory {spec!r} failed: {error!r}") from error
    keys = [f.name for f in fields(LoopBundle)]
    get = made.get if isinstance(made, dict) else (lambda key: getattr(made, key, None))
    missing = [key for key in keys if get(key) is None and key not in OPTIONAL]
    if missing:
        raise LoopModelError(f"Loop model factory {spec!r} returned no {', '.join(missing)}")
    values: dict[str, Any] = {key: get(key) for key in keys}
    bundle = LoopBundle(**values)
    ids = bundle.readout_token_ids
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if len(list(ids)) != 26 or not all(isinstance(i, int) for i in ids):
        raise LoopModelError(f"Loop model factory {spec!r}: readout_token_ids must be 26 ints")
    bundle.readout_token_ids = list(ids)
    k = bundle.trained_k
    if k is not None and not (isinstance(k, (list, tuple)) and len(k) == 2 and all(type(v) is int for v in k)
                              and 1 <= k[0] <= k[1]):
        raise LoopModelError(f"Loop model factory {spec!r}: trained_k must be [lo, hi], integers from 1")
    bundle.trained_k = None if k is None else list(k)
    if not isinstance(bundle.checkpoint_id, str):
        raise LoopModelError(f"Loop model factory {spec!r}: checkpoint_id must be a string")
    for key in ("model", "tokenizer", "render_prompt"):
        if not callable(get(key)):
            raise LoopModelError(f"Loop model factory {spec!r}: {key} is not callable")
    return bundle
