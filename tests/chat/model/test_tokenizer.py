import hashlib

import pytest

from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.tokenizer import (
    CHAT_SPECIALS,
    GPT2_RANKS,
    GPT2_RANKS_SHA256,
    ByteTokenizer,
    ChatTokenizer,
    gpt2_tokenizer,
    tokenizer_from_spec,
)


def test_gpt2_ranks_file_encodes_like_gpt2(gpt2_tok):
    assert gpt2_tok.encode_ordinary("Hello world") == [15496, 995]
    assert gpt2_tok.encode_ordinary("What is the capital of France?") == [2061, 318, 262, 3139, 286, 4881, 30]
    assert gpt2_tok.decode_single_token_bytes(995) == b" world"
    assert gpt2_tok.decode_single_token_bytes(50256) == b"<|endoftext|>"  # ordinary text, as in the seed
    assert isinstance(gpt2_tok, ChatTokenizer)


def test_gpt2_specials_follow_the_vocabulary(gpt2_tok):
    assert gpt2_tok.special_ids == {name: 50257 + i for i, name in enumerate(CHAT_SPECIALS)}
    assert gpt2_tok.n_vocab == 50262
    assert not gpt2_tok.is_special(50256)
    assert gpt2_tok.is_special(50257) and gpt2_tok.is_special(50303)  # padding ids stop too
    # specials are never produced from text
    assert 50257 not in gpt2_tok.encode_ordinary("<|bos|><|user_start|>")


def test_gpt2_special_map_is_configurable(gpt2_ranks):
    custom = {name: 50300 + i for i, name in enumerate(CHAT_SPECIALS)}
    tok = gpt2_tokenizer(str(gpt2_ranks), specials=custom)
    assert tok.special_ids["<|assistant_end|>"] == 50304 and tok.n_vocab == 50305
    with pytest.raises(ModelLoadError, match="lacks"):
        gpt2_tokenizer(str(gpt2_ranks), specials={"<|bos|>": 50257})
    with pytest.raises(ModelLoadError, match=">= 50257"):
        gpt2_tokenizer(str(gpt2_ranks), specials={name: 100 + i for i, name in enumerate(CHAT_SPECIALS)})


def test_missing_ranks_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.tiktoken"
    with pytest.raises(ModelLoadError, match="nope.tiktoken"):
        gpt2_tokenizer(str(missing))
    with pytest.raises(ModelLoadError, match="nope.tiktoken"):
        tokenizer_from_spec(f"gpt2:{missing}")


def test_unreadable_ranks_file(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("this is not base64 ranks\n")
    with pytest.raises(ModelLoadError, match="bad.tiktoken"):
        gpt2_tokenizer(str(bad))


def test_byte_tokenizer():
    tok = ByteTokenizer()
    ids = tok.encode_ordinary("Tokyo 東京")
    assert all(0 <= i < 256 for i in ids)
    assert b"".join(tok.decode_single_token_bytes(i) for i in ids).decode() == "Tokyo 東京"
    assert tok.special_ids == {name: 256 + i for i, name in enumerate(CHAT_SPECIALS)}
    assert tok.n_vocab == 261 and tok.is_special(256) and not tok.is_special(255)
    assert isinstance(tok, ChatTokenizer)


def test_spec_strings(gpt2_ranks):
    assert isinstance(tokenizer_from_spec("byte"), ByteTokenizer)
    assert tokenizer_from_spec(f"gpt2:{gpt2_ranks}").encode_ordinary("Hello world") == [15496, 995]
    with pytest.raises(ModelLoadError, match="unknown tokenizer"):
        tokenizer_from_spec("sentencepiece:/x.model")


def test_gpt2_without_a_path_uses_the_packaged_ranks_offline(monkeypatch):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    def offline(*args, **kwargs):
        raise ConnectionError("no route to host")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)  # the packaged file needs no download
    tok = tokenizer_from_spec("gpt2")
    assert tok.name == "gpt2" and tok.n_vocab == 50262
    ranks = load_tiktoken_bpe(str(GPT2_RANKS))
    reference = tiktoken.Encoding(name="reference", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                  special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    text = "Hello world! What is the capital of France?\n  Tokyo 東京, naïve café — 12 + 30 = 42.\tdon't <|bos|>"
    assert tok.encode_ordinary(text) == reference.encode_ordinary(text)
    assert tok.encode_ordinary("Hello world") == [15496, 995]


def test_packaged_ranks_match_the_recorded_checksum():
    digest = hashlib.sha256(GPT2_RANKS.read_bytes()).hexdigest()
    assert digest == GPT2_RANKS_SHA256
    assert f"sha256 `{digest}`" in (GPT2_RANKS.parent / "README.md").read_text()


def test_a_changed_packaged_file_is_refused(tmp_path, monkeypatch):
    import webapp.chat.model.tokenizer as tokenizer

    changed = tmp_path / "gpt2.tiktoken"
    changed.write_bytes(GPT2_RANKS.read_bytes().replace(b"IQ== 0\n", b"Ig== 0\n", 1))
    monkeypatch.setattr(tokenizer, "GPT2_RANKS", changed)
    with pytest.raises(ModelLoadError, match="gpt2.tiktoken: not a readable .tiktoken ranks file.*[Hh]ash"):
        tokenizer_from_spec("gpt2")
