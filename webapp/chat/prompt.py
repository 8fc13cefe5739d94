"""Chat prompt building: few-shot priming plus the most recent whole turns that fit the window.

prompt = [bos, *fewshot, *kept_turns, assistant_start]
user turn      -> [user_start, *encode_ordinary(text), user_end]
assistant turn -> [assistant_start, *encode_ordinary(text), assistant_end]
"""

from __future__ import annotations

from typing import Iterable, Mapping

from webapp.chat.tokenizer import ChatTokenizer

# The owner's priming examples (prompt-only, never shown): a small model imitates demonstrated
# length and tone far better than it follows an instruction. Same text as the owner's server.
FEWSHOT_EXAMPLES = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Why is the sky blue?", "Sunlight scatters off air molecules, and blue scatters the most."),
    ("Any tips for staying focused?", "Work in short blocks and put your phone out of reach."),
]

MIN_TURN_TOKENS = 3  # user_start, one token of text, user_end


class PromptTooLong(ValueError):
    """The newest message alone does not fit the window left after few-shot and the reply."""

    def __init__(self, excess: int, turn_tokens: int, budget: int):
        self.excess = excess
        self.turn_tokens = turn_tokens
        self.budget = budget
        super().__init__(
            f"Your message is {excess} token{'s' if excess != 1 else ''} too long for this model "
            f"({turn_tokens} tokens with its markers; at most {budget} fit with the reply length asked). "
            "Shorten it or ask for a shorter reply."
        )


class PromptBuilder:
    """Builds prompts for one tokenizer and window; the few-shot ids are encoded once."""

    def __init__(self, tokenizer: ChatTokenizer, block_size: int, fewshot=FEWSHOT_EXAMPLES):
        self.tokenizer = tokenizer
        self.block_size = block_size
        sp = tokenizer.special_ids
        self.bos = sp["<|bos|>"]
        self.user_start, self.user_end = sp["<|user_start|>"], sp["<|user_end|>"]
        self.assistant_start, self.assistant_end = sp["<|assistant_start|>"], sp["<|assistant_end|>"]
        self.fewshot_ids: list[int] = []
        for question, answer in fewshot:
            self.fewshot_ids += self.encode_turn("user", question) + self.encode_turn("assistant", answer)

    def encode_turn(self, role: str, text: str) -> list[int]:
        body = self.tokenizer.encode_ordinary(text)
        if role == "user":
            return [self.user_start, *body, self.user_end]
        if role == "assistant":
            return [self.assistant_start, *body, self.assistant_end]
        raise ValueError(f"unknown role {role!r}: expected 'user' or 'assistant'")

    def max_new_tokens_limit(self) -> int:
        """The largest max_new_tokens that still leaves room for a one-token user message."""
        return self.block_size - 2 - len(self.fewshot_ids) - MIN_TURN_TOKENS

    def budget(self, max_new_tokens: int) -> int:
        """Tokens left for conversation turns (the owner's formula)."""
        return self.block_size - max_new_tokens - 2 - len(self.fewshot_ids)

    def build(self, messages: Iterable[Mapping[str, str]], max_new_tokens: int) -> list[int]:
        """messages: [{"role": "user"|"assistant", "content": str}, ...], oldest first.

        Keeps the most recent whole turns that fit, walking back from the newest and stopping at
        the first that does not fit. Raises PromptTooLong when the newest turn alone does not fit,
        and ValueError when max_new_tokens is outside 1..max_new_tokens_limit().
        """
        limit = self.max_new_tokens_limit()
        if not 1 <= max_new_tokens <= limit:
            raise ValueError(f"max_new_tokens must be from 1 to {limit} for this model, got {max_new_tokens}")
        budget = self.budget(max_new_tokens)
        turns = [self.encode_turn(m["role"], m["content"]) for m in messages]

        kept: list[list[int]] = []
        total = 0
        for turn in reversed(turns):
            if total + len(turn) > budget:
                break
            kept.append(turn)
            total += len(turn)
        if turns and not kept:
            # the seed silently dropped the question here; say so instead
            raise PromptTooLong(len(turns[-1]) - budget, len(turns[-1]), budget)
        kept.reverse()

        ids = [self.bos, *self.fewshot_ids]
        for turn in kept:
            ids.extend(turn)
        ids.append(self.assistant_start)
        return ids
