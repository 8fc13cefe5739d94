"""Chat prompt building: few-shot priming plus the most recent whole turns that fit the window.

prompt = [bos, *fewshot, *kept_turns, assistant_start]
user turn      -> [user_start, *encode_ordinary(text), user_end]
assistant turn -> [assistant_start, *encode_ordinary(text), assistant_end]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from webapp.chat.model.tokenizer import ChatTokenizer

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


@dataclass
class PromptPart:
    """A stretch of the prompt: ids[start:end] of the prompt, or a turn dropped to fit (start = end)."""

    kind: str  # "bos", "fewshot", "turn", "dropped", "reply_start"
    role: str | None
    text: str | None
    start: int
    end: int
    tokens: int  # its length in tokens (a dropped turn's too)


@dataclass
class PromptReport:
    """The exact prompt a reply was given, what made it up, and the budget arithmetic behind it."""

    ids: list[int]
    block_size: int
    max_new_tokens: int
    fewshot_tokens: int
    budget: int  # tokens left for turns: block_size - max_new_tokens - 2 - fewshot_tokens
    parts: list[PromptPart] = field(default_factory=list)

    @property
    def turn_tokens(self) -> int:
        return sum(p.tokens for p in self.parts if p.kind == "turn")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptReport:
        return cls(**{**data, "parts": [PromptPart(**p) for p in data["parts"]]})


class PromptBuilder:
    """Builds prompts for one tokenizer and window; the few-shot ids are encoded once."""

    def __init__(self, tokenizer: ChatTokenizer, block_size: int,
                 fewshot: list[tuple[str, str]] = FEWSHOT_EXAMPLES) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        sp = tokenizer.special_ids
        self.bos = sp["<|bos|>"]
        self.user_start, self.user_end = sp["<|user_start|>"], sp["<|user_end|>"]
        self.assistant_start, self.assistant_end = sp["<|assistant_start|>"], sp["<|assistant_end|>"]
        self.fewshot = list(fewshot)
        self.fewshot_ids: list[int] = []
        for question, answer in self.fewshot:
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
        return self.explain(messages, max_new_tokens).ids

    def explain(self, messages: Iterable[Mapping[str, str]], max_new_tokens: int) -> PromptReport:
        """build(), with the parts of the prompt and the turns dropped to fit (see PromptReport)."""
        limit = self.max_new_tokens_limit()
        if not 1 <= max_new_tokens <= limit:
            raise ValueError(f"max_new_tokens must be from 1 to {limit} for this model, got {max_new_tokens}")
        budget = self.budget(max_new_tokens)
        messages = list(messages)
        turns = [self.encode_turn(m["role"], m["content"]) for m in messages]

        first_kept, total = len(turns), 0
        for i in range(len(turns) - 1, -1, -1):
            if total + len(turns[i]) > budget:
                break
            first_kept, total = i, total + len(turns[i])
        if turns and first_kept == len(turns):
            # the seed silently dropped the question here; say so instead
            raise PromptTooLong(len(turns[-1]) - budget, len(turns[-1]), budget)

        report = PromptReport([], self.block_size, max_new_tokens, len(self.fewshot_ids), budget)

        def add(kind: str, ids: list[int], role: str | None = None, text: str | None = None) -> None:
            start = len(report.ids)
            report.ids.extend(ids)
            report.parts.append(PromptPart(kind, role, text, start, len(report.ids), len(ids)))

        add("bos", [self.bos])
        for question, answer in self.fewshot:
            add("fewshot", self.encode_turn("user", question), "user", question)
            add("fewshot", self.encode_turn("assistant", answer), "assistant", answer)
        for i, (message, turn) in enumerate(zip(messages, turns)):
            if i < first_kept:
                report.parts.append(PromptPart("dropped", message["role"], message["content"], len(report.ids),
                                               len(report.ids), len(turn)))
            else:
                add("turn", turn, message["role"], message["content"])
        add("reply_start", [self.assistant_start])
        return report
