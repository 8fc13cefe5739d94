"""Steering, on the shared core: directions made and saved per model (from two lists of prompts, on the
core's worker, or imported), and a reply written again with directions added to its residual stream, as a
new version beside the original (webapp/chat/steering/compute.py has the torch work).

A steered version is an ordinary turn: the reply's exact prompt, its settings and seed, and an Edit that
adds α · v after block L at every position, prompt and reply alike; it runs as a row of the batched decode
step beside everyone's replies and keeps the fused kernel (webapp/chat/model/gpt.py). Its record
(`messages.intervention`) is {"kind": "steer", "directions": [{"direction", "layer", "alpha", "norm"}]}.
"""

from __future__ import annotations

import math
from typing import Any

from webapp.chat.directions import Direction, DirectionStore, TooManyDirections, name_problem, new_direction
from webapp.chat.interventions import Clamp, Steering, SteerTerm
from webapp.chat.model.edits import Edit
from webapp.chat.model.hooked import layout_problem
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steer import ClampTerm, Term, steer_edit_of
from webapp.chat.records import Conversation, Message
from webapp.chat.registry import Work
from webapp.chat.service import ChatError, ChatService, Turn
from webapp.chat.steering.compute import MAX_ALPHA, MAX_TERMS
from webapp.chat.steering.jobs import DirectionRequest, DirectionResult
from webapp.core import InferenceCore
from webapp.core.jobs import Job

MAX_PROMPTS = 64  # prompts on each side of a contrastive direction
MAX_DIRECTIONS_PER_OWNER = 200  # directions one browser (or API key) may keep, over every model
MAX_PROMPT_CHARS = 2000
REMOTE = ("Replies here come from a remote server (GLASSBOX_CHAT_BACKEND): there is no residual stream here "
          "to steer.")


class SteeringService:
    """What the steering views and /v1 call; knows the core, the chat service and the directions' store."""

    def __init__(self, core: InferenceCore, chat: ChatService) -> None:
        self.core, self.chat = core, chat
        self.store = DirectionStore(chat.store.db)

    # -- checks ------------------------------------------------------------------------------
    def model(self, name: object) -> tuple[str, LoadedChatModel]:
        """A model this server runs that can be steered. Raises ChatError: 400 (not one of ours), 409 (remote,
        not nanoGPT's layout)."""
        if name is None:
            name = self.chat.models.default
        if not isinstance(name, str) or name not in self.chat.models:
            raise ChatError(f"model must be one of this server's chat models: {', '.join(self.chat.models.names())}.",
                            400)
        loaded = self.chat.models.get(name)
        if getattr(loaded, "remote", False):
            raise ChatError(REMOTE, 409)
        problem = layout_problem(loaded.model)
        if problem is not None:
            raise ChatError(f"This model cannot be steered: {problem}.", 409)
        return name, loaded

    @staticmethod
    def layer(loaded: LoadedChatModel, layer: object) -> int:
        """A block of the model (0-based). Raises ChatError (400)."""
        n_layer = _config(loaded).n_layer
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < n_layer:
            raise ChatError(f"layer must be a block of this model, 0 to {n_layer - 1} (the direction is added after "
                            f"it); got {str(layer)[:40]!r}.", 400)
        return layer

    # -- directions ----------------------------------------------------------------------------
    def contrastive_request(self, loaded: LoadedChatModel, layer: int, positive: object, negative: object,
                            method: object = None) -> DirectionRequest:
        """Each prompt wrapped as the chat template wraps a user message (the few-shot turns, the message, the
        reply's start), read at its last position. method: "mean" (the default) or "pca" (pairs: as many
        positive prompts as negative). Raises ChatError (400)."""
        method = "mean" if method in (None, "") else method
        if method not in ("mean", "pca"):
            raise ChatError(f"method must be mean or pca, not {str(method)[:40]!r}.", 400)
        sides = []
        for side, prompts in (("positive", positive), ("negative", negative)):
            if (not isinstance(prompts, list) or not prompts or len(prompts) > MAX_PROMPTS
                    or not all(isinstance(p, str) and p.strip() for p in prompts)):
                raise ChatError(f"{side} must be a list of 1 to {MAX_PROMPTS} non-empty prompts (strings).", 400)
            if any(len(p) > MAX_PROMPT_CHARS for p in prompts):
                raise ChatError(f"Each prompt may have at most {MAX_PROMPT_CHARS} characters.", 400)
            try:
                sides.append(tuple(tuple(loaded.prompt.build([{"role": "user", "content": p}], 1)) for p in prompts))
            except ValueError as error:  # PromptTooLong
                raise ChatError(str(error), 400) from None
        if method == "pca" and (len(sides[0]) != len(sides[1]) or len(sides[0]) < 2):
            raise ChatError("method pca takes pairs: as many positive prompts as negative, two pairs at least.", 400)
        return DirectionRequest(layer, sides[0], sides[1], str(method))

    def start(self, owner: str, model: str, request: DirectionRequest) -> Job[DirectionRequest, DirectionResult]:
        """The job working a contrastive direction out. Raises Refused (queue full, too many jobs)."""
        job: Job[DirectionRequest, DirectionResult] = Job(self.chat.models.job_kind(Work.DIRECTION, model), owner,
                                                          request, result=DirectionResult())
        self.core.submit(job)
        return job

    def vector(self, loaded: LoadedChatModel, vector: object) -> list[float]:
        """An imported vector: the model's width of finite numbers. Raises ChatError (400)."""
        width = _config(loaded).n_embd
        if not isinstance(vector, list) or len(vector) != width:
            got = len(vector) if isinstance(vector, list) else type(vector).__name__
            raise ChatError(f"vector must be a list of {width} numbers, this model's width; got {got}.", 400)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vector):
            raise ChatError("vector must hold finite numbers only.", 400)
        return [float(v) for v in vector]

    @staticmethod
    def feature(loaded: LoadedChatModel, spec: object) -> tuple[int, list[float], dict[str, Any]]:
        """A dictionary feature's direction: its decoder row, added after the dictionary's block ->
        (layer, vector, how it was made). Raises ChatError (400)."""
        dictionaries = loaded.dictionaries or {}
        if not isinstance(spec, dict) or not isinstance(spec.get("dictionary"), str) \
                or not isinstance(spec.get("index"), int) or isinstance(spec.get("index"), bool):
            raise ChatError('feature must be {"dictionary": <name>, "index": <feature>}.', 400)
        found = dictionaries.get(spec["dictionary"])
        if found is None:
            names = ", ".join(dictionaries) or "none"
            raise ChatError(f"This model has no dictionary {spec['dictionary'][:64]!r} (it has: {names}).", 400)
        index = spec["index"]
        if not 0 <= index < found.sae.config.d_sae:
            raise ChatError(f"The dictionary {found.name!r} has features 0 to {found.sae.config.d_sae - 1}.", 400)
        vector = found.sae.W_dec[index].detach().float().cpu().tolist()
        return found.layer, vector, {"kind": "feature", "dictionary": found.name, "index": index,
                                     "label": found.labels[index]}

    def save(self, owner: str, model: str, name: object, layer: int, vector: list[float],
             made: dict[str, Any]) -> Direction:
        """Save a new named direction. Raises ChatError: 400 (a bad name), 409 (the name is taken)."""
        problem = name_problem(name)
        if problem is not None:
            raise ChatError(problem, 400)
        assert isinstance(name, str)
        direction = new_direction(model, name, layer, vector, made, owner)
        try:
            if not self.store.save(direction, MAX_DIRECTIONS_PER_OWNER):
                raise ChatError(f"This model already has a direction named {name!r}; choose another name.", 409)
        except TooManyDirections as error:
            raise ChatError(str(error), 429) from None
        return direction

    def direction(self, model: str, name: str) -> Direction:
        found = self.store.get(model, name)
        if found is None:
            raise ChatError(f"No direction named {name[:64]!r} for the model {model!r}.", 404)
        return found

    def directions(self, model: str) -> list[Direction]:
        return self.store.of_model(model)

    def delete(self, owner: str, model: str, name: str) -> bool:
        return self.store.delete(owner, model, name)

    # -- steering ------------------------------------------------------------------------------
    def terms(self, model: str, loaded: LoadedChatModel, steer: object) -> tuple[list[Term | ClampTerm],
                                                                                dict[str, Any]]:
        """`steer`, [{"direction": <name>, "alpha": <number>} or {"feature": {"dictionary", "index"}, "clamp":
        <number>}, ...] -> the terms and the version's record. Raises ChatError: 400 (malformed, a number not
        finite or beyond ±MAX_ALPHA, too many, no such feature), 404 (no such direction)."""
        if not isinstance(steer, list) or not steer:
            raise ChatError('steer must be a list of {"direction": <name>, "alpha": <number>}.', 400)
        if len(steer) > MAX_TERMS:
            raise ChatError(f"At most {MAX_TERMS} directions at once.", 400)
        terms: list[Term | ClampTerm] = []
        record, clamps = [], []
        width = _config(loaded).n_embd
        for item in steer:
            if isinstance(item, dict) and "feature" in item:  # a feature clamped to a value
                layer, _, made = self.feature(loaded, item["feature"])
                value = _number(item.get("clamp"), "clamp")
                terms.append(ClampTerm(layer, made["dictionary"], made["index"], value))
                clamps.append(Clamp(made["dictionary"], made["index"], layer, value))
                continue
            if not isinstance(item, dict) or not isinstance(item.get("direction"), str):
                raise ChatError('Each steer item must be {"direction": <name>, "alpha": <number>} or {"feature": '
                                '{"dictionary": <name>, "index": <feature>}, "clamp": <number>}.', 400)
            alpha = _number(item.get("alpha"), "alpha")
            direction = self.direction(model, item["direction"])
            if len(direction.vector) != width:
                raise ChatError(f"The direction {direction.name!r} has {len(direction.vector)} numbers; this model's "
                                f"width is {width}.", 409)
            terms.append(Term(direction.layer, direction.vector, float(alpha)))
            record.append(SteerTerm(direction.name, direction.layer, float(alpha), direction.norm))
        return terms, Steering(tuple(record), tuple(clamps)).record

    @staticmethod
    def edit(loaded: LoadedChatModel, terms: list[Term | ClampTerm]) -> Edit:
        edit = steer_edit_of(loaded, terms)
        assert edit is not None  # terms() gives one at least
        return edit

    def reply_turn(self, conversation: Conversation, message: Message, history: list[Message],
                   steer: object) -> Turn:
        """A new version of the reply, steered. Raises ChatError (400, 404, 409)."""
        if message.role != "assistant":
            raise ChatError("Only replies can be steered.", 404)
        self.chat.writer(message)  # 409 naming the model when it is not run here
        name = self.chat.writer_name(message)
        _, loaded = self.model(name)
        terms, record = self.terms(name, loaded, steer)
        return self.chat.rerun_turn(conversation, message, history, self.edit(loaded, terms), record)


def _number(value: object, name: str) -> float:
    """A strength or a clamp's value. Raises ChatError (400)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or abs(value) > MAX_ALPHA:
        raise ChatError(f"{name} must be a finite number from {-MAX_ALPHA:g} to {MAX_ALPHA:g}; "
                        f"got {str(value)[:40]!r}.", 400)
    return float(value)


def _config(loaded: LoadedChatModel) -> Any:
    model: Any = loaded.model  # nanoGPT's layout (checked before: SteeringService.model)
    return model.config
