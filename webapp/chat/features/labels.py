"""Labels people write for features (migration 009), shared by everyone on the server as the dictionaries are,
kept per dictionary fingerprint: a dictionary trained again into the same folder starts with its automatic
labels only. A written label is shown instead of the automatic one ("pushes ' Paris', ..."), which stays on the
feature's page; writing an empty label takes it away."""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass

from webapp.db import AnyDatabase

LABEL_CHARS = 120  # a label is a name, not a note


@dataclass(frozen=True)
class WrittenLabel:
    text: str
    owner: str  # the browser that wrote it
    created_at: float


def label_problem(text: object) -> str | None:
    """Why a label cannot be saved (None: it can). Empty is allowed: it takes the written label away."""
    if not isinstance(text, str):
        return "label must be a string."
    if len(text.strip()) > LABEL_CHARS:
        return f"A label is at most {LABEL_CHARS} characters (this one has {len(text.strip())})."
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") for c in text.strip()):
        return "A label is one line of text, without control characters."
    return None


class FeatureLabels:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db

    def of_dictionary(self, model: str, dictionary: str, fingerprint: str) -> dict[int, WrittenLabel]:
        """The written labels of one dictionary, by feature."""
        with self.db.connect() as db:
            rows = db.execute("SELECT feature, label, owner, created_at FROM feature_labels WHERE model = ? AND"
                              " dictionary = ? AND fingerprint = ?", (model, dictionary, fingerprint)).fetchall()
        return {int(r[0]): WrittenLabel(r[1], r[2], float(r[3])) for r in rows}

    def write(self, model: str, dictionary: str, fingerprint: str, feature: int, text: str, owner: str) -> None:
        """Save a feature's label (checked: label_problem), or take it away when `text` is blank."""
        text = " ".join(text.split())
        with self.db.transaction() as db:
            db.execute("DELETE FROM feature_labels WHERE model = ? AND dictionary = ? AND fingerprint = ? AND"
                       " feature = ?", (model, dictionary, fingerprint, feature))
            if text:
                db.execute("INSERT INTO feature_labels (model, dictionary, fingerprint, feature, label, owner,"
                           " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (model, dictionary, fingerprint, feature, text, owner, time.time()))
