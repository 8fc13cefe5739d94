"""An attribution report (webapp/chat/attribution/jobs.py) as the page and the JSON show it: each part's
push on a diverging scale (CSS classes: the CSP allows no inline styles), the grid of layers × heads with
the MLPs beside it, the largest contributors named, and `against` read from a query string."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.chat.attribution.jobs import AttributionReport
from webapp.chat.web.token_views import token_text

STEPS = 5  # shades each way: up1..up5 (pushes the token up), down1..down5; "flat" for about nothing
TOP = 10  # contributors named


@dataclass
class Part:
    key: str  # "L3.H5" (layers and heads from 0, as the ablation form takes them), "MLP 3", ...
    label: str  # said in full: "layer 3, head 5"
    value: float
    shade: str  # a CSS class: "up3", "down1", "flat"


@dataclass
class GridRow:
    layer: int
    heads: list[Part]
    mlp: Part


class BadAgainst(ValueError):
    """`against` is not a token id; the message says what is wanted."""


def parse_against(value: str | None) -> int | None:
    """?against=<token id> -> the id; None when absent or empty. Raises BadAgainst."""
    if value is None or not value.strip():
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise BadAgainst(f"against must be a token id (an integer); got {value[:40]!r}.") from None


def shade(value: float, scale: float) -> str:
    """Which of the diverging scale's classes a value takes, the largest |value| on the page at its end."""
    step = min(STEPS, round(abs(value) / scale * STEPS)) if scale > 0 else 0
    if step == 0:
        return "flat"
    return f"up{step}" if value > 0 else f"down{step}"


@dataclass(frozen=True)
class Scales:
    """The ends of the two scales: heads on their own, and the rest (MLPs, embeddings, biases) on theirs. One
    scale ran to the largest part, often an MLP many times any head's push, and left every head pale."""

    heads: float  # the largest push of any head
    others: float  # the largest push of an MLP, the embeddings or the biases


def scale_of(report: AttributionReport) -> Scales:
    a = report.attribution
    heads = [abs(v) for v in a.heads.flatten().tolist()]
    others = [abs(a.embed), abs(a.biases), *(abs(v) for v in a.mlps.tolist())]
    return Scales(max(heads, default=0.0), max(others))


def parts(report: AttributionReport) -> tuple[Part, list[GridRow], Part]:
    """-> (the embeddings, one grid row per layer (its heads, its MLP), the biases), each shaded on its scale."""
    a, scales = report.attribution, scale_of(report)
    embed = Part("embeddings", "the token and position embeddings", a.embed, shade(a.embed, scales.others))
    rows = [GridRow(layer, [Part(f"L{layer}.H{head}", f"layer {layer}, head {head}", v, shade(v, scales.heads))
                            for head, v in enumerate(heads)],
                    Part(f"MLP {layer}", f"layer {layer}'s MLP", mlp, shade(mlp, scales.others)))
            for layer, (heads, mlp) in enumerate(zip(a.heads.tolist(), a.mlps.tolist()))]
    biases = Part("biases", "the biases (c_proj's and the final layer norm's β)", a.biases,
                  shade(a.biases, scales.others))
    return embed, rows, biases


def largest(embed: Part, rows: list[GridRow], biases: Part, n: int = TOP) -> list[Part]:
    """The n parts that push hardest, either way, hardest first."""
    every = [embed, *(p for row in rows for p in (*row.heads, row.mlp)), biases]
    return sorted(every, key=lambda p: -abs(p.value))[:n]


def as_json(tokenizer, report: AttributionReport) -> dict:
    """The documented contract (docs/api.md, "Who pushed a token")."""
    request, a = report.request, report.attribution
    return {
        "token": {"index": request.index, "id": request.token, "text": token_text(tokenizer, request.token)[0]},
        "against": (None if request.against is None
                    else {"id": request.against, "text": token_text(tokenizer, request.against)[0]}),
        "logit": a.logit,
        "embed": a.embed,
        "heads": a.heads.tolist(),
        "mlps": a.mlps.tolist(),
        "biases": a.biases,
    }
