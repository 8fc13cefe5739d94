"""A reply's token's features, on the shared core: the Inside service's checks and context (the same ids the
model had, the same 404s and 409s), a job per request on the writer's features kind (or the one already queued
or running), finished readings kept, a bounded number, under their request."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from webapp.chat.decode import readings
from webapp.chat.decode.readings import Reading
from webapp.chat.features.jobs import FeaturesRequest, FeaturesResult, TextFeaturesRequest, TextFeaturesResult
from webapp.chat.features.labels import FeatureLabels, WrittenLabel, label_problem
from webapp.chat.inside.service import InsideService
from webapp.chat.records import Message, ReplyDetails
from webapp.chat.registry import Work
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError
from webapp.chat.store import ChatStore
from webapp.core import InferenceCore

SEARCH_RESULTS = 50  # features a label search lists
TEXT_TOKENS = 64  # tokens of a typed text whose features are read
REPLIES_SEARCHED = 500  # an owner's newest replies a feature page looks through for where it fired
NO_DICTIONARY = ("This model has no sparse dictionary: train one with `python -m webapp.features train` and "
                 "list it in GLASSBOX_CHAT_DICTIONARIES (docs/features.md).")


@dataclass(frozen=True)
class FoundFeature:
    """A feature a search found."""

    dictionary: str
    index: int
    label: str  # as shown: the written one, else the automatic one
    written: bool


@dataclass(frozen=True)
class FiredAt:
    """A reply where a feature fired, at its strongest token there."""

    conversation_id: str
    message_id: int
    title: str  # its conversation's
    token: int  # the token's index in the reply
    activation: float


class FeatureService(ReportJobs[FeaturesRequest, FeaturesResult, tuple[Reading, ...]]):
    """What the feature views call; knows the core and the Inside service, never the device."""

    def __init__(self, core: InferenceCore, inside: InsideService, keep: int = 32, store: ChatStore | None = None
                 ) -> None:
        super().__init__(core, inside.models, Work.FEATURES, keep, lambda result: result.report, FeaturesResult)
        self.inside, self.store = inside, store
        self.written = FeatureLabels(store.db) if store is not None else None  # labels people wrote
        # a typed text's features (a search), kept as a token's are
        self.texts: ReportJobs[TextFeaturesRequest, TextFeaturesResult, tuple[tuple[Reading, ...], ...]] = ReportJobs(
            core, inside.models, Work.FEATURE_TEXT, keep, lambda result: result.report, TextFeaturesResult)

    def unavailable(self, model: str) -> str | None:
        """Why a token's features cannot be read on that model (None: they can)."""
        if not self.models.get(model).dictionaries:
            return NO_DICTIONARY
        return None

    def request_for(self, model: str, message: Message, details: ReplyDetails, index: int) -> FeaturesRequest:
        """Token `index` of a reply. Raises ChatError: 404 (no such token), 409 (not finished, no dictionary)."""
        inside = self.inside.request_for(message, details, index)
        problem = self.unavailable(model)
        if problem is not None:
            raise ChatError(problem, 409)
        return FeaturesRequest(inside.context_ids, inside.index, inside.steer)

    def label_of(self, model: str, dictionary: str) -> Callable[[int], str]:
        """Each feature's label as shown: the one written for it, else its automatic one (the written ones read
        once, here; no copy of the automatic ones)."""
        automatic = self.models.get(model).dictionaries[dictionary].labels
        written = self.written_labels(model, dictionary)
        return lambda feature: written[feature].text if feature in written else automatic[feature]

    def written_labels(self, model: str, dictionary: str) -> dict[int, WrittenLabel]:
        if self.written is None:
            return {}
        fingerprint = self.models.get(model).dictionaries[dictionary].fingerprint
        return self.written.of_dictionary(model, dictionary, fingerprint)

    def write_label(self, model: str, dictionary: str, feature: int, text: object, owner: str) -> None:
        """A feature's written label (blank: none). Raises ChatError (400) for a label that cannot be saved."""
        problem = label_problem(text)
        if problem is not None or self.written is None:
            raise ChatError(problem or "Labels are not kept on this server.", 400)
        found = self.models.get(model).dictionaries[dictionary]
        self.written.write(model, dictionary, found.fingerprint, feature, str(text), owner)

    def text_request(self, model: str, text: str) -> TextFeaturesRequest:
        """A typed text, as a corpus's sequence is read: the start token, then its tokens. Raises ChatError (400)
        for a text that is empty or longer than TEXT_TOKENS tokens (or the model's window)."""
        loaded = self.models.get(model)
        ids = list(loaded.tokenizer.encode_ordinary(text))
        most = min(TEXT_TOKENS, loaded.block_size - 1)
        if not ids:
            raise ChatError("Type some text to read its features.", 400)
        if len(ids) > most:
            raise ChatError(f"That text is {len(ids)} tokens; its features are read for at most {most}.", 400)
        return TextFeaturesRequest((loaded.prompt.bos, *ids))

    def search(self, model: str, query: str, most: int = SEARCH_RESULTS) -> list[FoundFeature]:
        """The model's features whose label (written or automatic) holds `query`, ignoring case: written labels
        first, then by dictionary and index, at most `most`."""
        wanted = query.casefold().strip()
        found = []
        for name, loaded in self.models.get(model).dictionaries.items():
            written = self.written_labels(model, name)
            for feature, automatic in enumerate(loaded.labels):
                label = written[feature].text if feature in written else automatic
                if wanted in label.casefold() or wanted in automatic.casefold():
                    found.append(FoundFeature(name, feature, label, feature in written))
        return sorted(found, key=lambda f: (not f.written, f.dictionary, f.index))[:most]

    def report(self, model: str, request: FeaturesRequest, details: ReplyDetails | None = None
               ) -> tuple[Reading, ...] | None:
        """The readings, where known without a job: saved with the reply by the decode step that sampled the token
        (by every dictionary loaded now, as it is now), or kept from a job; None: start one."""
        found = self.saved(model, details, request.index) if details is not None else None
        return found if found is not None else self.kept.get(model, request)

    def fired_in(self, owner: str, model: str, dictionary: str, feature: int, shown: int = 10) -> list[FiredAt]:
        """The owner's replies where a feature fired, as their saved features say (the newest REPLIES_SEARCHED
        by that model), each reply at its strongest token, the strongest `shown` first. Another owner's replies
        are never read."""
        found = self.models.get(model).dictionaries[dictionary]
        places = []
        for reply in self.store.saved_features(owner, model, REPLIES_SEARCHED) if self.store is not None else []:
            try:
                column = json.loads(reply.features)
            except ValueError:
                continue
            hits = readings.fired(column, dictionary, found.fingerprint, feature)
            if hits:
                token, activation = max(hits, key=lambda hit: hit[1])
                places.append(FiredAt(reply.conversation_id, reply.message_id, reply.title, token, activation))
        return sorted(places, key=lambda place: -place.activation)[:shown]

    def saved(self, model: str, details: ReplyDetails, index: int) -> tuple[Reading, ...] | None:
        """Token `index`'s readings as saved with its reply, by every dictionary loaded now; None where not."""
        return readings.saved_reading(details.features, index, self.models.get(model).dictionaries)
