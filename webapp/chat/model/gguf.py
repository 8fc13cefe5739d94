"""The chat model as one GGUF file for llama.cpp (the command: webapp/chat/export.py), written with the
`gguf` package (llama.cpp's own gguf-py) without going through llama.cpp's converter.

Architecture "gpt2": the weights of webapp/chat/model/hf.py's GPT-2 form under llama.cpp's tensor names
(token_embd, position_embd, blk.N.attn_norm/attn_qkv/attn_output/ffn_norm/ffn_up/ffn_down, output_norm;
no output.weight: llama.cpp ties it to token_embd as GPT-2 does), in nn.Linear's (out, in) layout. Norms and
biases stay float32; the matrices are f32, f16 or q8_0 (q8_0 where a row is a whole number of 32-value
blocks, f16 otherwise). Note: llama.cpp's GPT-2 uses the tanh GELU where Glassbox uses the exact one.

The tokenizer is a GPT-2 byte-level BPE (`tokenizer.ggml.model` "gpt2", pre-tokenizer "gpt-2"): each
token's bytes written in GPT-2's byte-to-character map, the merges recovered from the ranks (hf.py). The
bundled byte-level tokenizer is the same with 256 one-byte tokens and no merges; llama.cpp refuses a BPE
vocabulary whose merges key is missing and gguf-py writes no empty array, so it gets one merge that can
never apply (two special tokens' texts: BPE starts from single characters and only merges grow them, and
specials are split out of the text before BPE runs). The five chat specials are CONTROL tokens (parsed in
a templated prompt, never printed), the embedding's padding rows UNUSED. <|bos|> is BOS (not added: the
template writes it), <|assistant_end|> EOS and <|user_start|> EOT, so a reply ends where Glassbox ends it
at those two. The chat template (hf.py's, few-shot priming included) is `tokenizer.chat_template`, so
llama-cpp-python's server applies it by itself (llama-server with --jinja).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from webapp.chat.model.hf import (
    CONV1D,
    LAYER_NORM_EPS,
    ExportError,
    bpe_vocab_and_merges,
    bytes_to_unicode,
    chat_template,
    gpt2_state,
)
from webapp.chat.model.tokenizer import ByteTokenizer

OUTTYPES = ("f32", "f16", "q8_0")
Q8_BLOCK = 32  # values per q8_0 block: a row must be a whole number of them
PARTS = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
         "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def gguf_tensors(model: Any) -> dict[str, np.ndarray]:
    """llama.cpp's names -> float32 arrays in (out, in) layout (GPT-2's Conv1D ones transposed back)."""
    state = gpt2_state(model)
    out = {"token_embd.weight": state["transformer.wte.weight"],
           "position_embd.weight": state["transformer.wpe.weight"],
           "output_norm.weight": state["transformer.ln_f.weight"], "output_norm.bias": state["transformer.ln_f.bias"]}
    for i in range(model.config.n_layer):
        for hf_part, part in PARTS.items():
            for kind in ("weight", "bias"):
                tensor = state[f"transformer.h.{i}.{hf_part}.{kind}"]
                if kind == "weight" and hf_part in CONV1D:
                    tensor = tensor.t()
                out[f"blk.{i}.{part}.{kind}"] = tensor
    return {name: t.contiguous().numpy().astype(np.float32) for name, t in out.items()}


def vocabulary(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """-> (token texts by id, token types, merges) for every row of the embedding."""
    import gguf

    texts: dict[int, str] = {}
    if isinstance(tokenizer, ByteTokenizer):
        chars = bytes_to_unicode()
        texts.update({b: chars[b] for b in range(256)})
        own: dict[int, str] = {}
        merges = ["<|bos|> <|assistant_end|>"]  # a merge that never applies (see above)
    elif hasattr(tokenizer, "_enc"):
        vocab, merges, own = bpe_vocab_and_merges(tokenizer)
        texts.update({i: text for text, i in vocab.items()})
    else:
        raise ExportError(f"tokenizer {tokenizer.name!r} has no GPT-2 form")
    control = {**own, **{i: s for s, i in tokenizer.special_ids.items()}}
    texts.update(control)
    if max(texts) >= vocab_size:
        raise ExportError(f"the tokenizer has id {max(texts)}, past the embedding's {vocab_size} rows")
    tokens, types = [], []
    for i in range(vocab_size):
        if i in control:
            types.append(gguf.TokenType.CONTROL)
        elif i in texts:
            types.append(gguf.TokenType.NORMAL)
        else:
            types.append(gguf.TokenType.UNUSED)
        tokens.append(texts.get(i, f"[PAD{i}]"))
    return tokens, [int(t) for t in types], merges


def _encoded(name: str, data: np.ndarray, outtype: str) -> tuple[np.ndarray, Any]:
    """(array to write, its GGML type or None for a plain float array)."""
    import gguf

    if data.ndim == 1 or outtype == "f32":
        return data, None
    if outtype == "q8_0" and data.shape[-1] % Q8_BLOCK == 0:
        q8 = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(data, q8), q8
    return data.astype(np.float16), None


def export_gguf(loaded: Any, path: Path, outtype: str = "f16") -> Path:
    """Write `loaded` (a LoadedChatModel) to `path` as a GGUF file -> path. Written next to it, then moved:
    a model that cannot export leaves no file."""
    import gguf

    if outtype not in OUTTYPES:
        raise ExportError(f"outtype {outtype!r}: expected one of {', '.join(OUTTYPES)}")
    model, tokenizer = loaded.model, loaded.tokenizer
    c = model.config
    tensors = gguf_tensors(model)
    tokens, types, merges = vocabulary(tokenizer, int(c.vocab_size))
    specials = tokenizer.special_ids
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    part = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(str(part), "gpt2")
    writer.add_name(f"Glassbox chat model {loaded.checkpoint_id}")
    writer.add_description(str(loaded.description))
    writer.add_context_length(int(c.block_size))
    writer.add_embedding_length(int(c.n_embd))
    writer.add_feed_forward_length(int(tensors["blk.0.ffn_up.weight"].shape[0]))
    writer.add_block_count(int(c.n_layer))
    writer.add_head_count(int(c.n_head))
    writer.add_layer_norm_eps(LAYER_NORM_EPS)
    writer.add_file_type(int(file_type))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(specials["<|bos|>"])
    writer.add_eos_token_id(specials["<|assistant_end|>"])
    writer.add_eot_token_id(specials["<|user_start|>"])
    writer.add_pad_token_id(specials["<|assistant_end|>"])
    writer.add_add_bos_token(False)  # the chat template writes <|bos|>
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template())
    for name, data in tensors.items():
        array, raw = _encoded(name, data, outtype)
        if raw is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, array, raw_dtype=raw)  # its shape in bytes: gguf works out the values
    try:
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        part.replace(path)
    except BaseException:  # a failed export leaves no file, its .part neither
        part.unlink(missing_ok=True)
        raise
    return path
