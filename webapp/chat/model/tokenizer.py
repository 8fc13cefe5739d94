"""Chat tokenizers: GPT-2's BPE (tiktoken) and a byte-level one, behind one small protocol.

Every chat tokenizer has five special tokens above its ordinary vocabulary. Generation stops at the
first sampled id >= the first special id (any special, or a padding id of the embedding), so
`is_special` is a single comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from webapp.chat.model.errors import ModelLoadError

if TYPE_CHECKING:
    import tiktoken

CHAT_SPECIALS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>")
GPT2_ENDOFTEXT = 50256
# GPT-2's BPE ranks ship with the package (webapp/chat/model/data/README.md): "gpt2" works offline.
GPT2_RANKS = Path(__file__).with_name("data") / "gpt2.tiktoken"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


@runtime_checkable
class ChatTokenizer(Protocol):
    name: str
    special_ids: dict[str, int]  # the five CHAT_SPECIALS -> ids
    first_special_id: int  # every id from here up (specials, embedding padding) ends a reply
    n_vocab: int  # ordinary tokens + specials; must not exceed the model's embedding rows

    def encode_ordinary(self, text: str) -> list[int]: ...
    def decode_single_token_bytes(self, token: int) -> bytes: ...
    def is_special(self, token: int) -> bool: ...


def _check_specials(specials: dict[str, int], first_free: int, where: str) -> dict[str, int]:
    missing = [s for s in CHAT_SPECIALS if s not in specials]
    if missing:
        raise ModelLoadError(f"{where}: special token map lacks {', '.join(missing)}")
    low = min(specials[s] for s in CHAT_SPECIALS)
    if low < first_free:
        raise ModelLoadError(f"{where}: special ids must be >= {first_free} (above the ordinary tokens), got {low}")
    return {s: int(specials[s]) for s in CHAT_SPECIALS}


class ByteTokenizer:
    """Ids 0..255 are the bytes of UTF-8 text; the five chat specials sit at 256..260."""

    name = "byte"

    def __init__(self, specials: dict[str, int] | None = None):
        default = {s: 256 + i for i, s in enumerate(CHAT_SPECIALS)}
        self.special_ids = _check_specials(specials or default, 256, "byte tokenizer")
        self.first_special_id = min(self.special_ids.values())
        self.n_vocab = max(self.special_ids.values()) + 1

    def encode_ordinary(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode_single_token_bytes(self, token: int) -> bytes:
        if not 0 <= token < 256:
            raise KeyError(f"byte tokenizer has no bytes for id {token}")
        return bytes((token,))

    def is_special(self, token: int) -> bool:
        return token >= self.first_special_id


class TiktokenChatTokenizer:
    """A tiktoken Encoding (ordinary BPE tokens) plus the chat specials."""

    def __init__(self, encoding: tiktoken.Encoding, specials: dict[str, int], name: str) -> None:
        self.name = name
        self._enc = encoding
        # the chat specials start right after <|endoftext|> (50256) in the owner's vocabulary
        self.special_ids = _check_specials(specials, encoding.max_token_value + 1, name)
        self.first_special_id = min(self.special_ids.values())
        self.n_vocab = max(self.special_ids.values()) + 1

    def encode_ordinary(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode_single_token_bytes(self, token: int) -> bytes:
        return self._enc.decode_single_token_bytes(token)

    def is_special(self, token: int) -> bool:
        return token >= self.first_special_id


def gpt2_tokenizer(path: str | None = None, specials: dict[str, int] | None = None) -> TiktokenChatTokenizer:
    """GPT-2's BPE read from a `.tiktoken` ranks file, chat specials at 50257..50261 by default.

    Without a path, the ranks file packaged with Glassbox (no download; tiktoken's own "gpt2"
    encoding would fetch its files from the internet).
    """
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's split pattern

    specials = specials or {s: GPT2_ENDOFTEXT + 1 + i for i, s in enumerate(CHAT_SPECIALS)}
    packaged = path is None
    ranks_path = GPT2_RANKS if path is None else Path(path)
    if not ranks_path.is_file():
        raise ModelLoadError(f"{ranks_path}: tokenizer ranks file not found")
    try:
        # the packaged file is checked against its recorded sha256 (about a millisecond)
        ranks = load_tiktoken_bpe(str(ranks_path), expected_hash=GPT2_RANKS_SHA256 if packaged else None)
    except Exception as e:
        raise ModelLoadError(f"{ranks_path}: not a readable .tiktoken ranks file ({type(e).__name__}: {e})") from None
    enc = tiktoken.Encoding(
        name=f"gpt2:{ranks_path.name}",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": len(ranks)},  # 50256, decoded as text like the seed's encoding
    )
    return TiktokenChatTokenizer(enc, specials, "gpt2" if packaged else f"gpt2:{ranks_path}")


def tokenizer_from_spec(spec: str) -> ChatTokenizer:
    """"byte", "gpt2" (the packaged ranks) or "gpt2:/path/to/gpt2.tiktoken"."""
    kind, _, arg = spec.partition(":")
    if kind == "byte" and not arg:
        return ByteTokenizer()
    if kind == "gpt2":
        return gpt2_tokenizer(arg or None)
    raise ModelLoadError(f"unknown tokenizer {spec!r}: use 'byte', 'gpt2' or 'gpt2:/path/to/gpt2.tiktoken'")


def token_bytes(tokenizer: ChatTokenizer, token: int) -> bytes | None:
    """A token's bytes; None for a special (nothing to print). How the pages and /v1 show a token differ
    (webapp/chat/web/token_views.py, webapp/v1/shapes.py); what a token is comes from here."""
    if tokenizer.is_special(token):
        return None
    return tokenizer.decode_single_token_bytes(token)


def special_name(tokenizer: ChatTokenizer, token: int) -> str | None:
    """A chat special's name (`<|user_start|>`), or None for a special the tokenizer does not name."""
    return next((name for name, i in tokenizer.special_ids.items() if i == token), None)
