import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from webapp.chat.model.prompt import FEWSHOT_EXAMPLES, MIN_TURN_TOKENS, PromptBuilder, PromptTooLong
from webapp.chat.model.tokenizer import ByteTokenizer

BOS, US, UE, AS, AE = 50257, 50258, 50259, 50260, 50261


def test_fewshot_is_the_owners_text():
    assert FEWSHOT_EXAMPLES == [
        ("What is the capital of France?", "The capital of France is Paris."),
        ("Why is the sky blue?", "Sunlight scatters off air molecules, and blue scatters the most."),
        ("Any tips for staying focused?", "Work in short blocks and put your phone out of reach."),
    ]


def test_fewshot_ids_are_tiktokens_plus_specials(gpt2_tok, gpt2_ranks):
    # an Encoding built here independently of webapp.chat.model.tokenizer
    enc = tiktoken.Encoding("gpt2-test",
                            pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                            mergeable_ranks=load_tiktoken_bpe(str(gpt2_ranks)), special_tokens={})
    expected = []
    for q, a in FEWSHOT_EXAMPLES:
        expected += [US, *enc.encode_ordinary(q), UE, AS, *enc.encode_ordinary(a), AE]
    builder = PromptBuilder(gpt2_tok, 1024)
    assert builder.fewshot_ids == expected
    assert expected[:9] == [US, 2061, 318, 262, 3139, 286, 4881, 30, UE]


def test_prompt_layout(gpt2_tok):
    b = PromptBuilder(gpt2_tok, 1024)
    ids = b.build([{"role": "user", "content": "Hello world"}], 200)
    assert ids == [BOS, *b.fewshot_ids, US, 15496, 995, UE, AS]
    ids = b.build([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello world"},
                   {"role": "user", "content": "Hello world"}], 200)
    assert ids[-10:] == [US, *gpt2_tok.encode_ordinary("Hi"), UE, AS, 15496, 995, AE, US, 15496, 995, UE, AS][-10:]
    assert b.build([], 200) == [BOS, *b.fewshot_ids, AS]


def _builder(budget: int, max_new: int = 10) -> PromptBuilder:
    """Byte-level builder whose turn budget is exactly `budget` at max_new_tokens=max_new."""
    fewshot_len = len(PromptBuilder(ByteTokenizer(), 10_000).fewshot_ids)
    b = PromptBuilder(ByteTokenizer(), budget + max_new + 2 + fewshot_len)
    assert b.budget(max_new) == budget
    return b


def msg(role, n):  # a turn of n + 2 tokens
    return {"role": role, "content": "x" * n}


def test_truncation_keeps_newest_whole_turns():
    b = _builder(30)
    # turn sizes (with markers): 12, 8, 12, 10 -> the newest three fill 30 exactly
    history = [msg("user", 10), msg("assistant", 6), msg("user", 10), msg("assistant", 8)]
    ids = b.build(history + [], 10)
    turns = ids[1 + len(b.fewshot_ids):-1]
    assert len(turns) == 30
    assert turns == b.encode_turn("assistant", "x" * 6) + b.encode_turn("user", "x" * 10) + \
        b.encode_turn("assistant", "x" * 8)
    assert len(b.build(history, 10)) <= b.block_size - 10


def test_truncation_stops_at_first_turn_that_does_not_fit():
    b = _builder(30)
    # newest 10 fits, then a 22-token turn does not: the tiny oldest turn is not picked up after it
    ids = b.build([msg("user", 1), msg("assistant", 20), msg("user", 8)], 10)
    assert ids[1 + len(b.fewshot_ids):-1] == b.encode_turn("user", "x" * 8)


def test_newest_turn_too_long_is_an_error_with_the_excess():
    b = _builder(30)
    assert b.build([msg("user", 28)], 10)  # 30 tokens: fits exactly
    with pytest.raises(PromptTooLong) as err:
        b.build([msg("assistant", 3), msg("user", 33)], 10)  # 35 tokens: 5 over
    assert err.value.excess == 5
    assert "5 tokens too long" in str(err.value)
    with pytest.raises(PromptTooLong) as err:
        b.build([msg("user", 29)], 10)
    assert err.value.excess == 1 and "1 token too long" in str(err.value)


def test_max_new_tokens_limit():
    b = PromptBuilder(ByteTokenizer(), 512)
    limit = b.max_new_tokens_limit()
    assert limit == 512 - 2 - len(b.fewshot_ids) - MIN_TURN_TOKENS
    assert len(b.build([msg("user", 1)], limit)) + limit == 512
    with pytest.raises(ValueError, match="max_new_tokens"):
        b.build([msg("user", 1)], limit + 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        b.build([msg("user", 1)], 0)


def test_unknown_role():
    with pytest.raises(ValueError, match="role"):
        PromptBuilder(ByteTokenizer(), 512).build([{"role": "system", "content": "x"}], 10)
