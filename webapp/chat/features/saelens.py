"""Dictionaries on disk in SAELens's format, so one trained here opens in SAELens and one SAELens trained opens
here: a folder with `cfg.json` and `sae_weights.safetensors` (W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc,
b_dec; `threshold` for JumpReLU).

cfg.json is read as SAELens 5 and 6 write it: the architecture ("standard", "topk", "jumprelu"; SAELens 5 gives
a TopK dictionary as "standard" with activation_fn_str "topk"), k (SAELens 6: `k`; 5: activation_fn_kwargs.k),
hook_name (SAELens 6 keeps it under `metadata`), apply_b_dec_to_input and normalize_activations (Glassbox reads
"none" only). It is written the SAELens 6 way, with hook_name at the top level as well.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from webapp.chat.features.sae import ARCHITECTURES, Dictionary, DictionaryConfig

HOOK = re.compile(r"blocks\.(\d+)\.hook_resid_post")
CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"


class DictionaryFileError(ValueError):
    """A dictionary folder that cannot be read, or does not fit: the message names the file and why."""


def save(sae: Dictionary, folder: Path, training: dict[str, Any] | None = None) -> None:
    """Write cfg.json and sae_weights.safetensors into `folder` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    c = sae.config
    cfg: dict[str, Any] = {
        "architecture": c.architecture, "d_in": c.d_in, "d_sae": c.d_sae, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": c.apply_b_dec_to_input, "normalize_activations": "none",
        "reshape_activations": "none", "hook_name": c.hook_name,
        "metadata": {"model_name": c.model_name, "hook_name": c.hook_name, "hook_head_index": None,
                     "prepend_bos": True, "sae_lens_training_version": None, "glassbox": training or {}},
    }
    if c.architecture == "topk":
        cfg["k"] = c.k
    tensors = {"W_enc": sae.W_enc, "W_dec": sae.W_dec, "b_enc": sae.b_enc, "b_dec": sae.b_dec}
    if c.architecture == "jumprelu":
        tensors["threshold"] = sae.threshold
    save_file({k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}, str(folder / WEIGHTS))
    (folder / CFG).write_text(json.dumps(cfg, indent=2) + "\n")


def load(folder: Path) -> Dictionary:
    """The dictionary in `folder`. Raises DictionaryFileError naming the file and the problem."""
    cfg_path, weights_path = folder / CFG, folder / WEIGHTS
    try:
        cfg = json.loads(cfg_path.read_text())
    except OSError as error:
        raise DictionaryFileError(f"{cfg_path}: cannot read it ({error.strerror or error})") from None
    except ValueError as error:
        raise DictionaryFileError(f"{cfg_path}: not JSON ({error})") from None
    if not isinstance(cfg, dict):
        raise DictionaryFileError(f"{cfg_path}: not a JSON object")
    config = config_of(cfg, cfg_path)
    try:
        tensors = load_file(str(weights_path))
    except (OSError, RuntimeError, ValueError) as error:
        raise DictionaryFileError(f"{weights_path}: cannot read it as safetensors ({error})") from None
    wanted = {"W_enc": (config.d_in, config.d_sae), "W_dec": (config.d_sae, config.d_in), "b_enc": (config.d_sae,),
              "b_dec": (config.d_in,)}
    if config.architecture == "jumprelu":
        if "threshold" not in tensors and "log_threshold" in tensors:
            tensors["threshold"] = tensors["log_threshold"].exp()
        wanted["threshold"] = (config.d_sae,)
    sae = Dictionary(config)
    for name, shape in wanted.items():
        found = tensors.get(name)
        if found is None:
            raise DictionaryFileError(f"{weights_path}: no tensor {name}")
        if tuple(found.shape) != shape:
            raise DictionaryFileError(f"{weights_path}: {name} is {tuple(found.shape)}, cfg.json makes it {shape}")
        with torch.no_grad():
            getattr(sae, name).copy_(found.float())
    return sae.eval().requires_grad_(False)


def config_of(cfg: dict[str, Any], where: Path) -> DictionaryConfig:
    found = cfg.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    hook = cfg.get("hook_name") or metadata.get("hook_name")
    if not isinstance(hook, str) or not HOOK.fullmatch(hook):
        raise DictionaryFileError(f"{where}: hook_name {hook!r} is not the residual stream after a block "
                                  "(blocks.L.hook_resid_post), the one place Glassbox reads dictionaries")
    architecture = cfg.get("architecture", "standard")
    k = cfg.get("k")
    if architecture == "standard" and cfg.get("activation_fn_str") == "topk":  # SAELens 5's TopK
        kwargs = cfg.get("activation_fn_kwargs")
        architecture, k = "topk", kwargs.get("k") if isinstance(kwargs, dict) else None
    if architecture not in ARCHITECTURES:
        raise DictionaryFileError(f"{where}: architecture {architecture!r} is not one Glassbox reads "
                                  f"({', '.join(ARCHITECTURES)})")
    normalize = cfg.get("normalize_activations") or "none"
    if normalize != "none":
        raise DictionaryFileError(f"{where}: normalize_activations {normalize!r}: Glassbox reads dictionaries of "
                                  "the raw residual stream only (\"none\")")
    d_in, d_sae = cfg.get("d_in"), cfg.get("d_sae")
    if not (isinstance(d_in, int) and isinstance(d_sae, int) and d_in > 0 and d_sae > 0):
        raise DictionaryFileError(f"{where}: d_in and d_sae must be positive integers (got {d_in!r}, {d_sae!r})")
    if architecture == "topk" and not (isinstance(k, int) and 0 < k <= d_sae):
        raise DictionaryFileError(f"{where}: a TopK dictionary needs k from 1 to d_sae (got {k!r})")
    model_name = metadata.get("model_name") or cfg.get("model_name") or ""
    layer = int(HOOK.fullmatch(hook).group(1))  # type: ignore[union-attr]
    return DictionaryConfig(d_in, d_sae, architecture, k=k if isinstance(k, int) and architecture == "topk" else 0,
                            layer=layer, apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
                            model_name=str(model_name))
