"""Steering directions, saved per chat model (migration 007): a name, the block it is added after, the vector,
its norm and how it was made. In SQLite or PostgreSQL (webapp/db), shared by everyone on the server as the
models are; the one who made a direction may delete it. And the terms a steered version ran with, read back
from its record and these directions, so that every experiment reads the steered model (terms_of)."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from webapp.chat.interventions import Steering
from webapp.chat.model.steer import ClampTerm, Term
from webapp.chat.service import ChatError
from webapp.db import AnyDatabase

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a direction's name: it is also a URL path segment


@dataclass(frozen=True)
class Direction:
    model: str  # the registry name of the model it belongs to
    name: str
    layer: int  # added after this block (0-based)
    vector: tuple[float, ...]  # the model's width
    norm: float
    made: dict[str, Any]  # how: {"kind": "contrastive", "positive": [...], "negative": [...], "read": ...} or imported
    owner: str
    created_at: float

    def as_json(self, with_vector: bool = True) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "model": self.model, "layer": self.layer, "norm": self.norm,
                                 "made": self.made, "created_at": self.created_at}
        if with_vector:
            found["vector"] = list(self.vector)
        return found


def name_problem(name: object) -> str | None:
    """Why a direction's name cannot be used (None: it can)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return ("name must be 1 to 64 letters, digits, '_', '-' or '.', starting with a letter or digit "
                f"(got {str(name)[:40]!r}).")
    return None


class TooManyDirections(Exception):
    def __init__(self, most: int) -> None:
        super().__init__(f"You have made {most} directions, the most one browser may keep: delete some on the "
                         "Directions page first.")


class DirectionStore:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db

    def save(self, direction: Direction, most: int = 0) -> bool:
        """Save a new direction -> False when the model already has one of that name (nothing saved). Raises
        TooManyDirections when its owner has `most` already (0: no limit), checked under the write lock."""
        with self.db.transaction() as db:
            taken = db.execute("SELECT 1 FROM directions WHERE model = ? AND name = ?",
                               (direction.model, direction.name)).fetchone()
            if taken:
                return False
            if most and db.execute("SELECT COUNT(*) FROM directions WHERE owner = ?",
                                   (direction.owner,)).fetchone()[0] >= most:
                raise TooManyDirections(most)
            db.execute("INSERT INTO directions (model, name, layer, vector, norm, made, owner, created_at)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (direction.model, direction.name, direction.layer, json.dumps(list(direction.vector)),
                        direction.norm, json.dumps(direction.made), direction.owner, direction.created_at))
        return True

    def get(self, model: str, name: str) -> Direction | None:
        with self.db.connect() as db:
            row = db.execute("SELECT * FROM directions WHERE model = ? AND name = ?", (model, name)).fetchone()
        return _direction(row) if row else None

    def of_model(self, model: str) -> list[Direction]:
        """The model's directions, newest first."""
        with self.db.connect() as db:
            rows = db.execute("SELECT * FROM directions WHERE model = ? ORDER BY created_at DESC, name",
                              (model,)).fetchall()
        return [_direction(row) for row in rows]

    def delete(self, owner: str, model: str, name: str) -> bool:
        """Delete the owner's direction -> whether there was one."""
        with self.db.transaction() as db:
            return bool(db.execute("DELETE FROM directions WHERE model = ? AND name = ? AND owner = ?",
                                   (model, name, owner)).rowcount)


def new_direction(model: str, name: str, layer: int, vector: list[float], made: dict[str, Any],
                  owner: str) -> Direction:
    return Direction(model, name, layer, tuple(vector), math.sqrt(sum(v * v for v in vector)), made, owner,
                     time.time())


def _direction(row: Any) -> Direction:
    return Direction(row["model"], row["name"], int(row["layer"]), tuple(json.loads(row["vector"])), float(row["norm"]),
                     json.loads(row["made"]), row["owner"], float(row["created_at"]))


def terms_of(store: DirectionStore, model: str, steering: Steering) -> tuple[Term | ClampTerm, ...]:
    """The terms a steered version ran with, from its record and the model's saved directions. Raises ChatError
    (409) when a direction was deleted since, or made again under its name."""
    terms = []
    for term in steering.terms:
        found = store.get(model, term.direction)
        if found is None or not math.isclose(found.norm, term.norm, rel_tol=1e-6) or found.layer != term.layer:
            raise ChatError(f"The direction {term.direction!r} this version was steered with was deleted or made "
                            "again since, so the version cannot be read again with it.", 409)
        terms.append(Term(found.layer, found.vector, term.alpha))
    return (*terms, *(ClampTerm(c.layer, c.dictionary, c.feature, c.value) for c in steering.clamps))
