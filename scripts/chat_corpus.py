"""Synthetic question/answer corpus for the bundled demo chat model.

Five categories: greetings, capitals, chemical symbols, small arithmetic (0..99, add/subtract) and
questions about Glassbox itself. Every category has a fixed answer template, so "exact answer" is
well defined. Held out from training (used only by the evaluation):
  - some question phrasings of every category (the facts themselves are all in training);
  - about 10% of the arithmetic operand pairs, whatever the phrasing.

Two training mixes (scripts/train_chat.py runs them one after the other):
  - "base": the first stage, from scratch (sample_train_base, unchanged since the first bundled model);
  - "sums": the second stage, from the first stage's weights (sample_train_sums): more sums, a third
    of them with one-digit operands and a third forced to carry or borrow, sums typed without
    spaces ("7+8"), a few more phrasings, fewer echo turns.
Both draw from the same training phrasings and never from the held-out pairs or phrasings.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Canada": "Ottawa", "Australia": "Canberra",
    "Brazil": "Brasília", "Mexico": "Mexico City", "Egypt": "Cairo", "Kenya": "Nairobi", "Russia": "Moscow",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "Poland": "Warsaw", "Greece": "Athens", "Turkey": "Ankara", "Ireland": "Dublin", "Austria": "Vienna",
    "Hungary": "Budapest", "Argentina": "Buenos Aires", "Chile": "Santiago", "Peru": "Lima",
    "Nigeria": "Abuja", "South Korea": "Seoul", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "Indonesia": "Jakarta", "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Switzerland": "Bern",
    "the Czech Republic": "Prague", "Iceland": "Reykjavík", "Morocco": "Rabat", "New Zealand": "Wellington",
    "the United Kingdom": "London", "the United States": "Washington, D.C.",
}

SYMBOLS = {
    "hydrogen": "H", "helium": "He", "lithium": "Li", "carbon": "C", "nitrogen": "N", "oxygen": "O",
    "fluorine": "F", "neon": "Ne", "sodium": "Na", "magnesium": "Mg", "aluminium": "Al", "silicon": "Si",
    "phosphorus": "P", "sulfur": "S", "chlorine": "Cl", "argon": "Ar", "potassium": "K", "calcium": "Ca",
    "titanium": "Ti", "chromium": "Cr", "manganese": "Mn", "iron": "Fe", "cobalt": "Co", "nickel": "Ni",
    "copper": "Cu", "zinc": "Zn", "silver": "Ag", "tin": "Sn", "iodine": "I", "tungsten": "W",
    "platinum": "Pt", "gold": "Au", "mercury": "Hg", "lead": "Pb", "uranium": "U",
}

# (training phrasings, held-out phrasings); {x} is the country / element, {a} {b} the operands.
CAPITAL_Q = (
    ["What is the capital of {x}?", "What's the capital of {x}?", "Tell me the capital of {x}.",
     "capital of {x}?", "Name the capital city of {x}.", "What city is the capital of {x}?",
     "{X}: what is its capital?", "I'd like to know the capital of {x}.", "{X}'s capital?"],
    ["Which city is the capital of {x}?", "Do you know the capital of {x}?",
     "Could you tell me the capital of {x}?"],
)
SYMBOL_Q = (
    ["What is the chemical symbol for {x}?", "What's the symbol for {x}?", "Chemical symbol of {x}?",
     "Tell me the chemical symbol of {x}.", "Which symbol does {x} have?",
     "How do you write {x} as a chemical symbol?", "{X} symbol?"],
    ["What is the element symbol for {x}?", "Do you know the chemical symbol for {x}?",
     "Could you tell me the symbol of {x}?"],
)
ADD_Q = (
    ["What is {a} plus {b}?", "What is {a} + {b}?", "{a} + {b} = ?", "Add {a} and {b}.", "Compute {a} + {b}.",
     "How much is {a} plus {b}?", "What do you get if you add {a} and {b}?", "{a}+{b}"],
    ["Calculate {a} plus {b}.", "What's {a} + {b}?", "Please work out {a} + {b}."],
)
SUB_Q = (
    ["What is {a} minus {b}?", "What is {a} - {b}?", "{a} - {b} = ?", "Subtract {b} from {a}.",
     "Compute {a} - {b}.", "How much is {a} minus {b}?", "What do you get if you take {b} from {a}?", "{a}-{b}"],
    ["Calculate {a} minus {b}.", "What's {a} - {b}?", "Please work out {a} - {b}."],
)

# Intents with one fixed answer each: (answer, training phrasings, held-out phrasings)
GREETINGS = [
    ("Hello! Ask me about capitals, chemical symbols, small sums or Glassbox.",
     ["Hello", "Hi", "Hi!", "Hello!", "Hey", "Hey there", "Good morning", "Good evening", "Hello there!",
      "Hi, how are you?", "Howdy", "Good day", "Hi there", "Hey, how is it going?", "Morning!", "Hello again"],
     ["Good afternoon!", "Hello, how are you?", "Hey, hi!"]),
    ("You're welcome!",
     ["Thanks", "Thank you!", "Thanks!", "Thank you very much.", "Great, thanks.", "Cheers, thank you",
      "Many thanks!", "Thank you, that helps.", "Thx", "Appreciate it, thanks!"],
     ["Thanks a lot!", "Thank you so much!"]),
    ("Goodbye! Come back any time.",
     ["Bye", "Goodbye!", "Bye bye", "See you later!", "I have to go now, bye.", "Bye for now", "See you!",
      "OK, goodbye.", "Later, bye!"],
     ["Goodbye, see you!", "OK bye!"]),
]
APP = [
    ("Glassbox is a web app for chatting with a small language model and watching the Loop lab.",
     ["What is Glassbox?", "What's Glassbox?", "Tell me about Glassbox.", "What does Glassbox do?",
      "Explain Glassbox.", "What is this app?", "What is this website?", "What is Glassbox used for?",
      "Describe Glassbox.", "Tell me what Glassbox is.", "What can I do in Glassbox?"],
     ["Can you describe Glassbox?", "What is Glassbox for?"]),
    ("The Loop lab shows a looped transformer following an A-Z pointer table, loop by loop.",
     ["What is the Loop lab?", "What's the Loop lab?", "Tell me about the Loop lab.",
      "What does the Loop lab show?", "Explain the Loop lab.", "What is the loop lab page?",
      "Describe the Loop lab.", "What is the Loop lab used for?", "What happens in the Loop lab?"],
     ["Can you describe the Loop lab?", "What is the Loop lab for?"]),
    ("Press the Stop button under the reply; the text written so far is kept.",
     ["How do I stop a reply?", "How can I stop the answer?", "How do I cancel a response?",
      "Can I stop you while you are writing?", "How to stop generation?", "Stop button?",
      "How can I stop a reply?", "Can I interrupt a reply?", "Is there a stop button?"],
     ["How do I stop a reply early?", "Is there a way to stop a reply?"]),
    ("I am a tiny demo model trained on synthetic questions about capitals, chemical symbols, small sums and Glassbox.",
     ["Who are you?", "What are you?", "What model are you?", "Are you a chatbot?", "What can you do?",
      "What can I ask you?", "Describe yourself.", "Introduce yourself.", "What kind of bot are you?"],
     ["Tell me about yourself.", "What kind of model are you?"]),
]

# Training-only phrasings the second stage adds (the held-out ones above are unchanged; none of these is
# one of them or a rewording of one).
EXTRA_TRAIN_Q = {
    "+": ["{a} + {b}?", "{a} plus {b}?", "{a} plus {b}", "Sum of {a} and {b}?", "And {a} + {b}?"],
    "-": ["{a} - {b}?", "{a} minus {b}?", "{a} minus {b}", "Take {b} away from {a}.", "And {a} - {b}?"],
}
EXTRA_GREETINGS = {
    "Hello! Ask me about capitals, chemical symbols, small sums or Glassbox.":
        ["Afternoon!", "Evening!", "Good morning!", "Hi, good evening.", "Hello, good morning!", "Hey!",
         "Hello you", "Hi, how is it going?", "Yo", "Greetings!"],
    "You're welcome!": ["Thank you", "Nice, thanks!", "Great, thank you!", "Thanks, that was useful."],
    "Goodbye! Come back any time.": ["Bye!", "Goodbye", "See you soon, bye!", "OK, see you later."],
}

# A training aid: repeating random strings teaches the model to copy from the question (entities,
# operands) much sooner than the sparse copies inside fact and sum answers do. Not evaluated.
ECHO_Q = ["Repeat after me: {x}", 'Say "{x}".', "Please repeat: {x}", "Echo {x}", "Can you say {x}?", "Say {x}"]

CATEGORIES = ("greeting", "capital", "symbol", "arithmetic", "app")
MIX = {"greeting": 0.05, "capital": 0.11, "symbol": 0.1, "arithmetic": 0.55, "app": 0.08, "echo": 0.11}
MIX_SUMS = {"greeting": 0.06, "capital": 0.09, "symbol": 0.08, "arithmetic": 0.65, "app": 0.07, "echo": 0.05}


@dataclass(frozen=True)
class QA:
    category: str
    question: str
    answer: str


def capital_answer(country: str) -> str:
    return f"The capital of {country} is {CAPITALS[country]}."


def symbol_answer(element: str) -> str:
    return f"The chemical symbol for {element} is {SYMBOLS[element]}."


def arithmetic_answer(a: int, op: str, b: int) -> str:
    return f"{a} {op} {b} = {a + b if op == '+' else a - b}."


def pair_held_out(a: int, op: str, b: int) -> bool:
    """About one operand pair in ten never appears in training (deterministic, order-sensitive)."""
    return zlib.crc32(f"{a}{op}{b}".encode()) % 10 == 0


def _fill(template: str, x: str = "", a: int = 0, b: int = 0) -> str:
    return template.format(x=x, X=x[:1].upper() + x[1:], a=a, b=b)


def _vary(rng: random.Random, text: str) -> str:
    """Light surface noise so the model does not hinge on exact casing and punctuation."""
    r = rng.random()
    if r < 0.15 and text[:1].isupper() and not text.startswith(("I ", "I'd")):
        text = text[0].lower() + text[1:]
    elif r < 0.25 and text[-1:] in "?.!":
        text = text[:-1]
    return text


def _random_text(rng: random.Random) -> str:
    """1-3 made-up words, digit strings or capitalised names."""
    def word():
        kind = rng.random()
        if kind < 0.35:
            return str(rng.randrange(10 ** rng.randint(1, 5)))
        w = "".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(1, 4)))
        return w.capitalize() if kind < 0.6 else w
    return " ".join(word() for _ in range(rng.randint(1, 3)))


def sample_train(rng: random.Random, mix: str = "base") -> QA:
    """One training question/answer from the named mix ("base" or "sums")."""
    return (sample_train_sums if mix == "sums" else sample_train_base)(rng)


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    """The second stage's operands: a third one-digit (both, or one of the two), a third that must carry
    (+) or borrow (-), a third uniform on 0..99; a - b keeps a >= b. Never a held-out pair."""
    while True:
        r = rng.random()
        if r < 0.2:
            a, b = rng.randrange(10), rng.randrange(10)
        elif r < 0.33:
            a, b = rng.randrange(10), rng.randrange(10, 100)
            if rng.random() < 0.5:
                a, b = b, a
        elif r < 0.66:
            a, b = rng.randrange(100), rng.randrange(100)
            if op == "+" and a % 10 + b % 10 < 10 or op == "-" and a % 10 >= b % 10:
                continue  # no carry / no borrow: draw again
        else:
            a, b = rng.randrange(100), rng.randrange(100)
        if op == "-" and b > a:
            a, b = b, a
        if not pair_held_out(a, op, b):
            return a, b


def _squeeze(rng: random.Random, text: str, op: str) -> str:
    """Sums as people type them: "7+8", "12-5" (a third of the time)."""
    return text.replace(f" {op} ", op) if rng.random() < 0.33 else text


def sample_train_sums(rng: random.Random) -> QA:
    """The second stage's mix (MIX_SUMS): mostly sums, hard ones and one-digit ones over-weighted."""
    cat = rng.choices(list(MIX_SUMS), weights=list(MIX_SUMS.values()))[0]
    if cat == "arithmetic":
        op = rng.choice("+-")
        a_, b_ = _operands(rng, op)
        q = _fill(rng.choice((ADD_Q if op == "+" else SUB_Q)[0] + EXTRA_TRAIN_Q[op]), a=a_, b=b_)
        return QA(cat, _vary(rng, _squeeze(rng, q, op)), arithmetic_answer(a_, op, b_))
    if cat == "greeting":
        answer, phrasings, _ = rng.choice(GREETINGS)
        return QA(cat, _vary(rng, rng.choice(phrasings + EXTRA_GREETINGS[answer])), answer)
    return sample_train_base(rng, cat)


def sample_train_base(rng: random.Random, cat: str | None = None) -> QA:
    """One training question/answer, drawn by the first stage's category mix (MIX), or of category cat."""
    if cat is None:
        cat = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    if cat == "capital":
        x = rng.choice(list(CAPITALS))
        q, a = _fill(rng.choice(CAPITAL_Q[0]), x=x), capital_answer(x)
    elif cat == "symbol":
        x = rng.choice(list(SYMBOLS))
        q, a = _fill(rng.choice(SYMBOL_Q[0]), x=x), symbol_answer(x)
    elif cat == "arithmetic":
        while True:
            op = rng.choice("+-")
            a_, b_ = rng.randrange(100), rng.randrange(100)
            if op == "-" and b_ > a_:
                a_, b_ = b_, a_  # answers stay non-negative
            if not pair_held_out(a_, op, b_):
                break
        q = _fill(rng.choice((ADD_Q if op == "+" else SUB_Q)[0]), a=a_, b=b_)
        a = arithmetic_answer(a_, op, b_)
    elif cat == "echo":
        a = _random_text(rng)
        q = _fill(rng.choice(ECHO_Q), x=a)
        return QA(cat, q, a)  # no surface noise: the payload is the answer
    else:
        answer, phrasings, _ = rng.choice(GREETINGS if cat == "greeting" else APP)
        q, a = rng.choice(phrasings), answer
    return QA(cat, _vary(rng, q), a)


def held_out(n_arithmetic: int = 400, seed: int = 7) -> list[QA]:
    """The evaluation set: held-out phrasings for every fact and intent, held-out operand pairs.

    The sums: n_arithmetic held-out pairs drawn at random, then every held-out pair whose operands are
    both one digit (2 + 3, 7 - 4) not drawn already; each under a random phrasing, a quarter of them
    typed without spaces ("7+8")."""
    rng = random.Random(seed)
    out = []
    for group, cat in ((GREETINGS, "greeting"), (APP, "app")):
        for answer, _, phrasings in group:
            out += [QA(cat, q, answer) for q in phrasings]
    for x in CAPITALS:
        out += [QA("capital", _fill(t, x=x), capital_answer(x)) for t in CAPITAL_Q[1]]
    for x in SYMBOLS:
        out += [QA("symbol", _fill(t, x=x), symbol_answer(x)) for t in SYMBOL_Q[1]]
    pairs = [(a, op, b) for op in "+-" for a in range(100) for b in range(100)
             if pair_held_out(a, op, b) and (op == "+" or b <= a)]
    picked = rng.sample(pairs, min(n_arithmetic, len(pairs)))
    picked += [p for p in pairs if p[0] < 10 and p[2] < 10 and p not in picked]
    for a, op, b in picked:
        templates = (ADD_Q if op == "+" else SUB_Q)
        q = _fill(rng.choice(templates[0] + templates[1]), a=a, b=b)  # unseen pair, any phrasing
        if rng.random() < 0.25:
            q = q.replace(f" {op} ", op)
        out.append(QA("arithmetic", q, arithmetic_answer(a, op, b)))
    return out


def write_jsonl(path: str, exchanges: int, seed: int = 0, mix: str = "sums") -> None:
    """The training mix as a corpus for `python -m webapp.features train`: one {"user", "assistant"} a line."""
    import json

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(exchanges):
            qa = sample_train(rng, mix)
            out.write(json.dumps({"user": qa.question, "assistant": qa.answer}) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the bundled chat model's synthetic training text as a "
                                                 "JSON-lines corpus (python -m webapp.features reads it).")
    parser.add_argument("out")
    parser.add_argument("--exchanges", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix", choices=["base", "sums"], default="sums")
    args = parser.parse_args()
    write_jsonl(args.out, args.exchanges, args.seed, args.mix)
