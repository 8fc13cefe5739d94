"""The chat model as a Hugging Face GPT-2 model directory (the command: webapp/chat/export.py).

The model is written as transformers' GPT2LMHeadModel reads it (and so vLLM, and llama.cpp's
convert_hf_to_gguf.py): config.json, generation_config.json, model.safetensors, vocab.json, merges.txt,
tokenizer_config.json with the five chat specials and a chat template that builds the chat page's
prompt (few-shot priming included). Needs nothing beyond the app's own packages.

Both tokenizers export: GPT-2's BPE as GPT-2's own vocab.json and merges.txt (the merges recovered from
the ranks), the byte-level one as a byte-level BPE with 256 tokens and no merges, so every UTF-8 byte is
its own token as in Glassbox. tests/v1/test_export.py loads both with transformers and checks the
logits (1e-4, fp32) and the token ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from webapp.chat.model.prompt import FEWSHOT_EXAMPLES
from webapp.chat.model.tokenizer import CHAT_SPECIALS, ByteTokenizer

# nanoGPT keeps nn.Linear weights (out, in); GPT-2's Conv1D, and every engine that reads GPT-2, (in, out)
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
LAYER_NORMS = ("ln_1", "ln_2")
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which webapp/chat/model/gpt.py uses


class ExportError(Exception):
    """The model cannot be written as a GPT-2 directory; the message says why."""


# -- weights ----------------------------------------------------------------------------------------
def gpt2_state(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights under GPT2LMHeadModel's names and layouts (lm_head is tied to wte: not stored).
    A model without biases gets zero biases, which GPT-2's layers always have: the same function."""
    config = model.config
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    needed = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"]
    needed += [f"transformer.h.{i}.{part}.weight" for i in range(config.n_layer) for part in CONV1D + LAYER_NORMS]
    missing = [k for k in needed if k not in state]
    if missing:
        raise ExportError(f"the model does not have GPT-2's layout (nanoGPT's parameter names): no {missing[0]}"
                          f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}")
    if "lm_head.weight" in state and not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"]):
        raise ExportError("lm_head.weight differs from transformer.wte.weight; GPT-2 ties them")
    out = {"transformer.wte.weight": state["transformer.wte.weight"],
           "transformer.wpe.weight": state["transformer.wpe.weight"]}

    def weight_and_bias(name: str, conv1d: bool) -> None:
        weight = state[f"{name}.weight"]
        out[f"{name}.weight"] = weight.t().contiguous() if conv1d else weight
        out[f"{name}.bias"] = state.get(f"{name}.bias", torch.zeros(weight.shape[0]))

    for i in range(config.n_layer):
        for part in LAYER_NORMS:
            weight_and_bias(f"transformer.h.{i}.{part}", conv1d=False)
        for part in CONV1D:
            weight_and_bias(f"transformer.h.{i}.{part}", conv1d=True)
    weight_and_bias("transformer.ln_f", conv1d=False)
    return out


def gpt2_config(model: Any, tokenizer: Any) -> dict[str, Any]:
    c = model.config
    sp = tokenizer.special_ids
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": int(c.vocab_size),
            "n_positions": int(c.block_size), "n_ctx": int(c.block_size), "n_embd": int(c.n_embd),
            "n_layer": int(c.n_layer), "n_head": int(c.n_head), "n_inner": None,
            "activation_function": "gelu",  # nn.GELU(): the exact erf form, not GPT-2's tanh "gelu_new"
            "layer_norm_epsilon": LAYER_NORM_EPS, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
            "tie_word_embeddings": True, "torch_dtype": "float32",
            "bos_token_id": sp["<|bos|>"], "eos_token_id": sp["<|assistant_end|>"]}


def generation_config(model: Any, tokenizer: Any) -> dict[str, Any]:
    """Glassbox ends a reply at any id from the first special up (the specials and the embedding's
    padding rows), and samples at temperature 1 with top-k 50 by default: engines that read this file
    (transformers' generate, vLLM) do the same."""
    sp = tokenizer.special_ids
    return {"bos_token_id": sp["<|bos|>"], "pad_token_id": sp["<|assistant_end|>"],
            "eos_token_id": list(range(tokenizer.first_special_id, int(model.config.vocab_size))),
            "do_sample": True, "temperature": 1.0, "top_k": 50}


# -- tokenizer --------------------------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (vocab.json and merges.txt are in it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's merge loop on a token's bytes, with only the merges made before it: for a BPE
    vocabulary it ends in the two parts whose merge made the token."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def bpe_vocab_and_merges(tokenizer: Any) -> tuple[dict[str, int], list[str], dict[int, str]]:
    """-> (vocab.json, merges.txt lines, the encoding's own specials by id) for a tiktoken tokenizer."""
    enc = tokenizer._enc  # the tiktoken Encoding (TiktokenChatTokenizer keeps it)
    own_specials = {enc.encode_single_token(s): s for s in enc.special_tokens_set}
    ordinary = min(own_specials, default=enc.n_vocab)
    chars = bytes_to_unicode()
    ranks = {enc.decode_single_token_bytes(i): i for i in range(ordinary)}
    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab["".join(chars[b] for b in token)] = rank
        if len(token) > 1:
            parts = _bpe_parts(ranks, token, rank)
            if len(parts) != 2:
                raise ExportError(f"token {rank} ({token!r}) is not the merge of two tokens: not a BPE vocabulary")
            merges.append(" ".join("".join(chars[b] for b in part) for part in parts))
    vocab.update({text: i for i, text in own_specials.items()})  # <|endoftext|> (50256), as GPT-2's vocab.json
    return vocab, merges, own_specials


def chat_template() -> str:
    """PromptBuilder's prompt as a Jinja chat template: <|bos|>, the few-shot turns, the conversation,
    then <|assistant_start|>. System (and developer) messages as /v1 takes them (webapp/v1/params.py
    chat_turns): before the next user message, a blank line between. Unlike PromptBuilder it never drops
    old turns to fit the window: an engine refuses a prompt that is too long instead."""
    def lit(text: str) -> str:
        return json.dumps(text)  # a JSON string is a valid Jinja string literal

    fewshot = "".join(f"{{{{- '<|user_start|>' + {lit(q)} + '<|user_end|>' -}}}}"
                      f"{{{{- '<|assistant_start|>' + {lit(a)} + '<|assistant_end|>' -}}}}"
                      for q, a in FEWSHOT_EXAMPLES)
    return ("{%- set ns = namespace(pending=[]) -%}"
            "{{- '<|bos|>' -}}" + fewshot +
            "{%- for message in messages -%}"
            "{%- if message['role'] in ['system', 'developer'] -%}"
            "{%- set ns.pending = ns.pending + [message['content']] -%}"
            "{%- elif message['role'] == 'user' -%}"
            "{{- '<|user_start|>' + (ns.pending + [message['content']]) | join('\\n\\n') + '<|user_end|>' -}}"
            "{%- set ns.pending = [] -%}"
            "{%- elif message['role'] == 'assistant' -%}"
            "{{- '<|assistant_start|>' + message['content'] + '<|assistant_end|>' -}}"
            "{%- endif -%}"
            "{%- endfor -%}"
            "{%- if ns.pending -%}{{- '<|user_start|>' + ns.pending | join('\\n\\n') + '<|user_end|>' -}}{%- endif -%}"
            "{%- if add_generation_prompt -%}{{- '<|assistant_start|>' -}}{%- endif -%}")


def tokenizer_files(tokenizer: Any, block_size: int) -> dict[str, str]:
    """vocab.json, merges.txt and tokenizer_config.json for GPT2Tokenizer."""
    if isinstance(tokenizer, ByteTokenizer):
        chars = bytes_to_unicode()
        merges: list[str] = []
        own: dict[int, str] = {}
        vocab = {chars[b]: b for b in range(256)}
    elif hasattr(tokenizer, "_enc"):
        vocab, merges, own = bpe_vocab_and_merges(tokenizer)
    else:
        raise ExportError(f"tokenizer {tokenizer.name!r} has no GPT-2 form")
    specials = {**own, **{i: s for s, i in tokenizer.special_ids.items()}}
    added = {str(i): {"content": s, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False,
                      "special": True} for i, s in sorted(specials.items())}
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": block_size, "add_prefix_space": False,
              "add_bos_token": False, "clean_up_tokenization_spaces": False, "errors": "replace",
              # every role named, so nothing is added beside the five chat specials (a byte vocabulary
              # has no <|endoftext|>, which GPT2Tokenizer would otherwise add at id 256)
              "bos_token": "<|bos|>", "eos_token": "<|assistant_end|>", "unk_token": "<|assistant_end|>",
              "pad_token": "<|assistant_end|>", "additional_special_tokens": list(CHAT_SPECIALS),
              "added_tokens_decoder": added, "chat_template": chat_template()}
    return {"vocab.json": json.dumps(vocab, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "".join(m + "\n" for m in merges),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}


# -- the directory ----------------------------------------------------------------------------------
def export_hf(loaded: Any, out_dir: Path) -> list[Path]:
    """Write `loaded` (a LoadedChatModel) to out_dir as a GPT-2 model directory -> the files written."""
    from safetensors.torch import save_file

    model, tokenizer = loaded.model, loaded.tokenizer
    if not all(hasattr(model.config, a) for a in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")):
        raise ExportError("the model's config lacks GPT-2's fields (n_layer, n_head, n_embd, vocab_size, block_size)")
    state = gpt2_state(model)  # before anything is written: a model that cannot export leaves no directory
    files = tokenizer_files(tokenizer, int(model.config.block_size))
    files["config.json"] = json.dumps(gpt2_config(model, tokenizer), indent=2)
    files["generation_config.json"] = json.dumps(generation_config(model, tokenizer), indent=2)
    files["README.md"] = (f"# Glassbox chat model\n\nExported by `python -m webapp.chat.export hf` from "
                          f"`{loaded.checkpoint_id}`:\n{loaded.description}.\n\nA GPT-2 model directory "
                          "(transformers' GPT2LMHeadModel). See docs/api.md in Glassbox.\n")
    # Each file is written as NAME.part and renamed once all are: a failed export leaves nothing behind
    # (nor the directory, when it made it), and never half of a model over an earlier export.
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts: list[Path] = []
    try:
        parts.append(out_dir / "model.safetensors.part")
        save_file(state, str(parts[-1]), metadata={"format": "pt"})  # transformers wants "pt"
        for name, text in files.items():
            parts.append(out_dir / f"{name}.part")
            parts[-1].write_text(text, encoding="utf-8")
        for part in parts:
            part.replace(part.with_suffix(""))
    except BaseException:
        for part in parts:
            part.unlink(missing_ok=True)
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return sorted(out_dir / name for name in [*files, "model.safetensors"])
