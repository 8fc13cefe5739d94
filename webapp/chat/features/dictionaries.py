"""A chat model's sparse dictionaries (webapp/chat/features), loaded with it at start-up: the folders
GLASSBOX_CHAT_DICTIONARIES names (a registry model's `dictionaries = [...]`), else every dictionary in
`dictionaries/` beside the checkpoint (the bundled model's). A folder that cannot be read, or whose dictionary
does not fit the model (its width, its block), stops start-up naming the folder and the mismatch.

Each feature gets an automatic label from the tokens it pushes up: its decoder row through the final layer
norm's scale and the output layer (Neuronpedia's "logit effects"), its three strongest.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from webapp.chat.features import contexts
from webapp.chat.features.sae import Dictionary
from webapp.chat.features.saelens import CFG, WEIGHTS, DictionaryFileError, load
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.tokenizer import special_name, token_bytes

LABEL_TOKENS = 3
PUSHES = 10  # tokens a feature page lists as pushed up, and as pushed down
Pushes = tuple[torch.Tensor, torch.Tensor]  # (values, token ids), each (d_sae, top)


@dataclass
class LoadedDictionary:
    name: str  # its folder's name
    path: Path
    sae: Dictionary
    labels: list[str]  # per feature
    pushes: list[list[tuple[int, float]]]  # per feature: (token, logit effect), strongest first
    stats: dict[str, Any] | None  # density and top contexts on a corpus (webapp/chat/features/contexts.py), if made
    fingerprint: str = ""  # of its files: features saved with a reply were read by this very dictionary
    pulls: list[list[tuple[int, float]]] = field(default_factory=list)  # per feature: the tokens it pushes down

    @property
    def hook_name(self) -> str:
        return self.sae.config.hook_name

    @property
    def layer(self) -> int:
        return self.sae.config.layer

    @functools.cached_property
    def encoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder as one linear layer, laid out for the decode kernel (webapp/chat/model/kernels): the
        weight W_encᵀ (d_sae, d_in), contiguous, and the bias with b_dec folded in (b_enc − b_dec W_enc), so
        that x @ weightᵀ + bias = sae.pre_activations(x)."""
        sae = self.sae
        with torch.no_grad():
            bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.config.apply_b_dec_to_input else sae.b_enc
            return sae.W_enc.T.contiguous().float(), bias.float().contiguous()


def folders(spec: str, checkpoint: str) -> list[Path]:
    """The dictionary folders a model loads: those named (comma-separated; "none": none), else those in
    `dictionaries/` beside the checkpoint."""
    if spec.strip() == "none":
        return []
    if spec.strip():
        return [Path(part.strip()).expanduser() for part in spec.split(",") if part.strip()]
    beside = Path(checkpoint).parent / "dictionaries"
    return sorted(p for p in beside.iterdir() if (p / "cfg.json").is_file()) if beside.is_dir() else []


def load_dictionaries(spec: str, checkpoint: str, model: Any, tokenizer: Any) -> dict[str, LoadedDictionary]:
    """Every dictionary the model loads, checked against it, labelled. Raises ModelLoadError naming the folder."""
    found: dict[str, LoadedDictionary] = {}
    config = getattr(model, "config", None)
    for path in folders(spec, checkpoint):
        try:
            sae = load(path)
        except DictionaryFileError as error:
            raise ModelLoadError(f"dictionary {error}") from None
        width, n_layer = getattr(config, "n_embd", None), getattr(config, "n_layer", None)
        if sae.config.d_in != width:
            raise ModelLoadError(f"dictionary {path}: d_in is {sae.config.d_in}, the model's width is {width}")
        if not isinstance(n_layer, int) or not 0 <= sae.config.layer < n_layer:
            raise ModelLoadError(f"dictionary {path}: {sae.config.hook_name} reads block {sae.config.layer}; the "
                                 f"model has blocks 0 to {(n_layer or 1) - 1}")
        if path.name in found:
            raise ModelLoadError(f"dictionary {path}: two dictionaries named {path.name!r}")
        device = model.transformer.wte.weight.device
        sae = sae.to(device)
        pushed, pulled = (_rows(*side) for side in pushes(model, sae, PUSHES))
        found[path.name] = LoadedDictionary(path.name, path, sae, labels(pushed, tokenizer), pushed,
                                            contexts.load(path, sae.config.d_sae), fingerprint(path),
                                            pulled)
    return found


def fingerprint(folder: Path) -> str:
    """A short hash of a dictionary's cfg.json and weights: a dictionary trained again into the same folder
    gets another one."""
    digest = hashlib.sha256()
    for name in (CFG, WEIGHTS):
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


@torch.inference_mode()
def pushes(model: Any, sae: Dictionary, top: int) -> tuple[Pushes, Pushes]:
    """Each feature's strongest pushes up and down: its decoder row scaled by ln_f's γ, through lm_head, in one
    product -> ((values, token ids) up, the same down), each (d_sae, top), strongest first (down: the most
    negative first)."""
    gamma = model.transformer.ln_f.weight.float()
    weight = model.lm_head.weight.float()
    rows = max(1, 2**24 // weight.size(0))  # features at a time: never a (d_sae, V) matrix for a large vocabulary
    found: dict[bool, tuple[list[torch.Tensor], list[torch.Tensor]]] = {True: ([], []), False: ([], [])}
    for start in range(0, sae.W_dec.size(0), rows):
        effects: torch.Tensor = (sae.W_dec[start:start + rows].float() * gamma) @ weight.T  # (rows, V)
        for up, (values, indices) in found.items():
            best = effects.topk(min(top, effects.size(-1)), dim=-1, largest=up)
            values.append(best.values.cpu())
            indices.append(best.indices.cpu())
    return ((torch.cat(found[True][0]), torch.cat(found[True][1])),
            (torch.cat(found[False][0]), torch.cat(found[False][1])))


def _rows(values: torch.Tensor, ids: torch.Tensor) -> list[list[tuple[int, float]]]:
    return [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]


def labels(pushed: list[list[tuple[int, float]]], tokenizer: Any) -> list[str]:
    return ["pushes " + ", ".join(repr(text(tokenizer, t)) for t, _ in row[:LABEL_TOKENS]) for row in pushed]


def text(tokenizer: Any, token: int) -> str:
    found = token_bytes(tokenizer, token)
    if found is None:  # a special: its name, as the token panel names it
        return special_name(tokenizer, token) or f"<special {token}>"
    return found.decode("utf-8", "replace")
