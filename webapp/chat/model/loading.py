"""Load a chat model and its tokenizer from a checkpoint, refusing anything that does not fit.

Checkpoint formats:
  (a) a raw state dict as torch.save writes it (keys may carry torch.compile's `_orig_mod.` prefix);
  (b) a nanoGPT checkpoint: {"model": state_dict, "model_args": {...}, ...};
  (c) a .safetensors file.
A config.json beside any of them (GPTConfig fields + "tokenizer") is read. The architecture comes
from `arch` (a preset, key=value pairs or a JSON file: webapp/chat/model/arch.py), config.json, the
checkpoint's own config and the tensor shapes, field by field; n_head is never guessed. With
`factory="module:function"` (or "path/to/file.py:function") the owner's own code builds the model,
called exactly like their build_model(arch), with `arch` passed as it is.

Every problem raises ModelLoadError with the file and the mismatch in its message.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from webapp.chat.model.arch import fields_from, parse_arch, read_json, resolve_config
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.gpt import GPT
from webapp.chat.model.precision import PrecisionError, apply_precision, parse_precision
from webapp.chat.model.prompt import PromptBuilder
from webapp.chat.model.tokenizer import ChatTokenizer, tokenizer_from_spec

__all__ = ["LoadedChatModel", "ModelLoadError", "load_chat_model"]

@dataclass
class LoadedChatModel:
    model: nn.Module  # eval mode, on its device; model(idx) -> (logits, loss)
    tokenizer: ChatTokenizer
    block_size: int
    supports_kv_cache: bool  # has prefill/new_cache: generate() uses the fast path
    checkpoint_id: str  # "model.safetensors@1a2b3c4d5e6f" (file name + sha256 prefix)
    description: str  # one line for the UI/logs: architecture, size, tokenizer, where the config came from
    prompt: PromptBuilder  # few-shot encoded once for this tokenizer and window
    precision: str = "float32"  # as webapp/chat/model/precision.py names it: float32, bfloat16, float16, int8
    n_params: int = 0  # parameters, counted before int8 turns weights into buffers
    torch_threads: int = 0  # intra-op threads for its replies; 0 = the core worker's setting
    remote: bool = False  # replies come from a remote backend (GLASSBOX_CHAT_BACKEND): this model gives the prompts
    prefix_cache: Any = None  # its replies' kept KV caches: a PrefixCache built at boot (webapp/chat/boot.py)
    dictionaries: Any = None  # its sparse dictionaries by name, loaded at boot (webapp/chat/features/dictionaries.py)


def _file_id(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return f"{path.name}@{h.hexdigest()[:12]}"


def _without_folders(spec: str) -> str:
    """A setting as the description names it: files by their names. The description is public (/v1/models
    answers anyone), and the server's folders are nobody's business; start-up errors keep the full paths."""
    return re.sub(r"[^\s'\"(:]*/", "", spec)


def _read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """-> (state dict, the checkpoint's own config or None, what to call that config)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), None, ""
        except Exception as e:
            raise ModelLoadError(f"{path}: unreadable safetensors file ({type(e).__name__}: {e})") from None

    try:
        # weights_only: a checkpoint is data; never run code from a pickle
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelLoadError(f"{path}: unreadable checkpoint ({type(e).__name__}: {str(e)[:300]})") from None
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):  # nanoGPT's train.py format
        return obj["model"], obj.get("model_args"), f"{path.name} model_args"
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None, ""
    raise ModelLoadError(f"{path}: neither a state dict of tensors nor a nanoGPT checkpoint with 'model'")


def _clean_state(state: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("_orig_mod.", ""): v for k, v in state.items()}  # torch.compile's wrapper prefix


def _load_factory(spec: str) -> Callable[..., Any]:
    target, _, func = spec.rpartition(":")
    if not target or not func:
        raise ModelLoadError(f"factory {spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    try:
        if target.endswith(".py"):
            if not Path(target).is_file():
                raise ModelLoadError(f"factory {spec!r}: file {target} not found")
            mod_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if mod_spec is None or mod_spec.loader is None:
                raise ModelLoadError(f"factory {spec!r}: {target} cannot be imported as a module")
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        factory: Callable[..., Any] = getattr(module, func)
        return factory
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"factory {spec!r} cannot be imported ({type(e).__name__}: {e})") from None


def _list(keys: Iterable[str], n: int = 5) -> str:
    keys = sorted(keys)
    more = f", ... ({len(keys)} in all)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def _is_tied(model: nn.Module) -> bool:
    try:
        return model.get_submodule("lm_head").weight is model.get_submodule("transformer.wte").weight
    except AttributeError:
        return False


def _load_strict(model: nn.Module, state: dict[str, Any], path: Path, hint: str) -> None:
    """Check keys and shapes, then load. A model on the meta device takes the tensors as they are."""
    expected = model.state_dict()
    for k in [k for k in state if k not in expected and re.search(r"\.attn\.(bias|masked_bias)$", k)]:
        del state[k]  # causal-mask buffers of older nanoGPT / HF checkpoints, not weights
    tied = _is_tied(model)
    if tied and "transformer.wte.weight" in state:
        if "lm_head.weight" not in state:
            state["lm_head.weight"] = state["transformer.wte.weight"]  # stored once (safetensors)
        elif not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"]):
            raise ModelLoadError(f"{path}: lm_head.weight differs from transformer.wte.weight, "
                                 "but this model ties them (untied heads are not supported)")
    problems = []
    missing = expected.keys() - state.keys()
    unexpected = state.keys() - expected.keys()
    if missing:
        problems.append(f"missing keys: {_list(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_list(unexpected)}")
    # the embeddings first: their shapes say most (vocab, width, window)
    wrong = sorted((k for k in expected.keys() & state.keys() if expected[k].shape != state[k].shape),
                   key=lambda k: (not k.startswith(("transformer.wte", "transformer.wpe")), k))
    problems += [f"shape of {k}: model expects {tuple(expected[k].shape)}, checkpoint has {tuple(state[k].shape)}"
                 for k in wrong[:3]]
    if len(wrong) > 3:
        problems.append(f"{len(wrong) - 3} more tensors of the wrong shape")
    if problems:
        raise ModelLoadError(f"{path}: does not match the model ({hint}): " + "; ".join(problems))
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta:
        # assign would keep the checkpoint's own tensors, which a .safetensors file maps from disk: a
        # decode step then reads its weights through the page cache's mapping, measurably slower than
        # from ordinary memory (not recorded in docs/benchmarks-history.md). Own copies, one tensor at a time.
        state = {k: v.clone() for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=on_meta)
    if tied and on_meta:  # assign gives each key its own Parameter: tie them again
        model.get_submodule("transformer.wte").weight = model.get_submodule("lm_head").weight


def _embedding_rows(model: nn.Module) -> int | None:
    rows = getattr(getattr(model, "config", None), "vocab_size", None)
    if rows is None:
        wte = model.state_dict().get("transformer.wte.weight")
        rows = None if wte is None else wte.shape[0]
    return rows


def _resolve_tokenizer(spec: str | None, configs: list[dict[str, Any]], path: Path) -> ChatTokenizer:
    named = [c["tokenizer"] for c in configs if isinstance(c.get("tokenizer"), str) and c["tokenizer"]]
    if not spec and named:
        spec = named[0]
        kind, _, arg = spec.partition(":")
        if arg and not Path(arg).is_absolute():  # a ranks file named relative to the config (and checkpoint)
            spec = f"{kind}:{path.parent / arg}"
    if not spec:
        raise ModelLoadError(f"{path}: no tokenizer named: set GLASSBOX_CHAT_TOKENIZER "
                             "(gpt2, gpt2:/path/to/gpt2.tiktoken or byte)")
    return tokenizer_from_spec(spec)


def load_chat_model(checkpoint: str, *, arch: str | None = None, tokenizer_spec: str | None = None,
                    factory: str | None = None, device: str = "cpu",
                    dtype: str | torch.dtype | None = "float32") -> LoadedChatModel:
    """Load, check and place a chat model. Raises ModelLoadError naming the file and the mismatch.
    dtype: a precision of webapp/chat/model/precision.py (float32, bfloat16, float16, int8; None: the device's)."""
    path = Path(checkpoint)
    if not path.is_file():
        raise ModelLoadError(f"{path}: checkpoint not found")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ModelLoadError(f"device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    try:
        precision = parse_precision(dtype, dev)
    except PrecisionError as e:
        raise ModelLoadError(str(e)) from None

    state, args, args_source = _read_checkpoint(path)
    state = _clean_state(state)
    json_path = path.with_name("config.json")  # beside any checkpoint, .pt included
    cfg_json = read_json(json_path, str(json_path)) if json_path.is_file() else None
    tokenizer = _resolve_tokenizer(tokenizer_spec, [c for c in (cfg_json, args) if c], path)

    if factory:
        build = _load_factory(factory)
        try:
            model = build(arch)
        except Exception as e:
            raise ModelLoadError(f"factory {factory!r} failed for arch {arch!r} ({type(e).__name__}: {e})") from None
        if not isinstance(model, nn.Module) or not hasattr(getattr(model, "config", None), "block_size"):
            raise ModelLoadError(f"factory {factory!r} must return an nn.Module with config.block_size")
        source = f"factory {_without_folders(factory)}({_without_folders(repr(arch))})"
    else:
        sources = [parse_arch(arch)] if arch else []  # first wins, field by field
        if cfg_json:
            sources.append((fields_from(cfg_json, str(json_path), strict=False), json_path.name))
        if args:
            sources.append((fields_from(args, args_source, strict=False), args_source))
        config, source = resolve_config(state, sources, path)
        with torch.device("meta"):  # no random init to throw away (seconds for 254M)
            model = GPT(config)

    rows = _embedding_rows(model)
    if rows is not None and tokenizer.n_vocab > rows:
        raise ModelLoadError(f"{path}: tokenizer {tokenizer.name} needs {tokenizer.n_vocab} ids (chat specials "
                             f"included) but the model's embedding has only {rows} rows")
    _load_strict(model, state, path, source)
    n_params = sum(p.numel() for p in model.parameters())  # before int8 turns weights into buffers
    apply_precision(model.to(device=dev), precision).eval()

    c: Any = model.config  # GPTConfig, or the owner's factory's config
    block_size = int(c.block_size)
    kv = callable(getattr(model, "prefill", None)) and callable(getattr(model, "new_cache", None))
    has_shape = all(hasattr(c, a) for a in ("n_layer", "n_head", "n_embd"))
    shape = f"{c.n_layer}L/{c.n_head}H/{c.n_embd}d " if has_shape else ""
    description = (f"{type(model).__name__} {shape}{n_params / 1e6:.1f}M params, block {block_size}, "
                   f"tokenizer {tokenizer.name}, {precision} on {dev}, "
                   f"config from {source}, {'KV cache' if kv else 'full recompute'}")
    return LoadedChatModel(model=model, tokenizer=tokenizer, block_size=block_size, supports_kv_cache=kv,
                           checkpoint_id=_file_id(path), description=description,
                           prompt=PromptBuilder(tokenizer, block_size), precision=precision, n_params=n_params)
