"""The chat model's architecture (a GPTConfig) from the setting, config files and tensor shapes.

GLASSBOX_CHAT_ARCH (the loader's `arch`) is one of:
    a preset name                 gpt2-254m
    key=value pairs               n_layer=2,n_head=4,n_embd=128,block_size=512   (also vocab_size, bias)
    the path of a JSON file       {"n_layer": 2, "n_head": 4, ...}
Each field comes from the first source that has it: the setting, a config.json beside the checkpoint,
the checkpoint's own model_args, and last the tensor shapes. Shapes show every field exactly except the
number of heads (the heads' q, k and v are one (3C, C) matrix whatever their count), so n_head is never
guessed: without a source for it, loading stops and says what to set.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.gpt import PRESETS, GPTConfig

ARCH_VAR = "GLASSBOX_CHAT_ARCH"
FIELDS = tuple(f.name for f in dataclasses.fields(GPTConfig))  # block_size, vocab_size, n_layer, n_head, n_embd, bias
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_EXAMPLE = "n_layer=2,n_head=4,n_embd=128,block_size=512"


def _value(key: str, value: object, where: str) -> int | bool:
    if key == "bias":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        raise ModelLoadError(f"{where}: bad value bias={value!r} (true or false)")
    number = int(value) if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value) else value
    if isinstance(number, int) and not isinstance(number, bool) and number > 0:
        return number
    raise ModelLoadError(f"{where}: bad value {key}={value!r} (a positive integer)")


def fields_from(mapping: dict[str, Any], where: str, *, strict: bool) -> dict[str, Any]:
    """The GPTConfig fields of `mapping`, checked. strict: other keys are an error (the setting);
    otherwise they are skipped (config.json and model_args also hold training notes, dropout...)."""
    unknown = sorted(set(mapping) - set(FIELDS))
    if strict and unknown:
        raise ModelLoadError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                             f"(known: {', '.join(FIELDS)})")
    return {k: _value(k, v, where) for k, v in mapping.items() if k in FIELDS and v is not None}


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"{what}: file {path} not found")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: unreadable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object of config fields")
    return data


def parse_arch(spec: str) -> tuple[dict[str, Any], str]:
    """-> (the fields the setting gives, where they came from, for the description)."""
    spec = spec.strip()
    where = f"{ARCH_VAR}={spec}"
    if "=" in spec:
        pairs = {}
        for item in (s.strip() for s in spec.split(",") if s.strip()):  # a trailing comma is fine
            key, eq, value = (p.strip() for p in item.partition("="))
            if not eq or not key or not value or key in pairs:
                raise ModelLoadError(f"{where}: expected key=value pairs separated by commas, e.g. {_EXAMPLE} "
                                     f"(each key once), got {item!r}")
            pairs[key] = value
        return fields_from(pairs, where, strict=True), where
    if spec in PRESETS:
        # bias is plain to see in the keys, so a preset does not force it
        return {k: v for k, v in dataclasses.asdict(PRESETS[spec]).items() if k != "bias"}, f"preset {spec}"
    if spec.lower().endswith(".json") or "/" in spec or Path(spec).is_file():
        path = Path(spec)
        # the second value names the source in the public description: the file, not its folder
        return fields_from(read_json(path, where), f"{ARCH_VAR} file {path}", strict=True), path.name
    raise ModelLoadError(f"unknown arch {spec!r} in {ARCH_VAR}: give a preset ({', '.join(PRESETS)}), "
                         f"key=value pairs (e.g. {_EXAMPLE}) or the path of a JSON file with those keys")


def shape_fields(state: dict[str, Any]) -> dict[str, Any]:
    """Every field the tensors show exactly: all but n_head."""
    found: dict[str, int | bool] = {"bias": "transformer.h.0.attn.c_attn.bias" in state}
    layers = {int(m.group(1)) for k in state if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    if layers:
        found["n_layer"] = len(layers)
    wte, wpe = state.get("transformer.wte.weight"), state.get("transformer.wpe.weight")
    if wte is not None and wte.dim() == 2:
        found["vocab_size"], found["n_embd"] = (int(n) for n in wte.shape)
    if wpe is not None and wpe.dim() == 2:
        found["block_size"] = int(wpe.shape[0])
    return found


def _no_heads(path: Path, found: dict[str, Any], state: dict[str, Any]) -> ModelLoadError:
    shapes = ", ".join(f"{k} {tuple(state[k].shape)}" for k in ("transformer.wte.weight", "transformer.wpe.weight",
                                                                "transformer.h.0.attn.c_attn.weight") if k in state)
    dims = ", ".join(f"{k}={found[k]}" for k in FIELDS if k in found)
    return ModelLoadError(
        f"{path}: the number of attention heads cannot be read from the tensor shapes and no config gives it "
        f"(found {dims}; {shapes}). Set {ARCH_VAR}=n_head=N, N dividing n_embd={found.get('n_embd')}, "
        f"or add \"n_head\" to {path.with_name('config.json')}")


def resolve_config(state: dict[str, Any], sources: list[tuple[dict[str, Any], str]],
                   path: Path) -> tuple[GPTConfig, str]:
    """Merge (fields, where) sources, first wins, then the tensor shapes. -> (config, description)."""
    merged: dict[str, Any] = {}
    used: list[str] = []
    for fields, where in [*sources, (shape_fields(state), "tensor shapes")]:
        new = {k: fields[k] for k in FIELDS if k in fields and k not in merged}
        if new:
            # the first source speaks for itself; later ones say what they filled in
            used.append(where if not used else f"{where} ({', '.join(new)})")
            merged.update(new)
    missing = [k for k in FIELDS if k not in merged and k != "n_head"]
    if missing:
        raise ModelLoadError(f"{path}: cannot tell {', '.join(missing)}: no transformer.wte/wpe.weight or "
                             "transformer.h.N tensors, so not a GPT in nanoGPT's layout "
                             f"(set {ARCH_VAR}, or GLASSBOX_CHAT_FACTORY for other models)")
    if "n_head" not in merged:
        raise _no_heads(path, merged, state)
    if merged["n_embd"] % merged["n_head"]:
        raise ModelLoadError(f"{path}: n_embd={merged['n_embd']} is not divisible by n_head={merged['n_head']} "
                             f"(config from {' + '.join(used)})")
    return GPTConfig(**merged), " + ".join(used)
