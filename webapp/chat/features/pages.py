"""The features of a reply's token (webapp/chat/features/service.py), as a page (no JavaScript needed: the request waits
for its job) and as JSON: for each of the model's dictionaries, the features active at the position that
produced the token, strongest first, with their activations and labels. The owner's, and read-only through a
share link."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import abort, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from webapp.chat.decode.readings import Reading
from webapp.chat.features.dictionaries import LoadedDictionary
from webapp.chat.features.dictionaries import text as token_text
from webapp.chat.features.labels import LABEL_CHARS
from webapp.chat.features.service import SEARCH_RESULTS, TEXT_TOKENS, FeatureService, FoundFeature
from webapp.chat.inside.waiting import InsideError, report_or_wait, runnable_writer
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.records import Conversation, Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service
from webapp.chat.web.presenter_view import show_followers, show_followers_everywhere
from webapp.chat.web.share import shared_message
from webapp.chat.web.token_views import whitespace_name
from webapp.web.security import csrf_exempt, owner_id
from webapp.web.state import glassbox


def feature_service() -> FeatureService:
    return glassbox().service(FeatureService)


PANEL_FEATURES = 5  # features the token panel lists per dictionary; the Features page lists every active one


@bp.app_context_processor
def features_context() -> dict[str, Any]:
    """has_features(message): whether the model that wrote a reply has a dictionary (the token panel's link),
    asked of the models in memory. saved_features(message, index): the token's strongest features as the decode
    step that sampled it read them, for the token panel (model, [(reading, rows)]); None where not saved."""
    def has_features(message: Message) -> bool:
        models = service().models
        name = service().writer_name(message)
        return name in models and bool(models.get(name).dictionaries)

    def saved_features(message: Message, index: int) -> tuple[str, list[Any]] | None:
        if not has_features(message):
            return None
        model = service().writer_name(message)
        details = service().details(message.id)
        found = feature_service().saved(model, details, index)
        return None if found is None else (model, labelled(model, found, PANEL_FEATURES))
    return {"has_features": has_features, "saved_features": saved_features}


def labelled(model: str, readings: tuple[Reading, ...], top: int | None = None,
             labels: dict[str, Callable[[int], str]] | None = None
             ) -> list[tuple[Reading, list[tuple[int, float, str]]]]:
    """Each reading with its (feature, activation, label) rows, the `top` strongest (None: all); `labels`: each
    dictionary's labels (FeatureService.label_of), when the caller read them already."""
    if labels is None:
        labels = {r.dictionary: feature_service().label_of(model, r.dictionary) for r in readings}  # one read each
    return [(r, [(i, a, labels[r.dictionary](i)) for i, a in r.features[:top]]) for r in readings]


@bp.get("/c/<conversation_id>/m/<int:message_id>/features/<int:index>")
def token_features(conversation_id: str, message_id: int, index: int) -> ResponseReturnValue:
    conversation = owned_conversation(conversation_id)
    shown = page(conversation, owned_message(conversation_id, message_id), index)
    return show_followers(shown, conversation_id, message_id, f"features/{index}",
                          f"the features of token {index + 1}")


@bp.get("/shared/<token>/m/<int:message_id>/features/<int:index>")
def shared_token_features(token: str, message_id: int, index: int) -> ResponseReturnValue:
    conversation, message = shared_message(token, message_id)
    return page(conversation, message, index, shared=token)


def page(conversation: Conversation, message: Message, index: int, shared: str | None = None) -> ResponseReturnValue:
    common = {"conversation": conversation, "message": message, "index": index, "shared": shared}
    try:
        model, readings = resolved(message, index)
    except InsideError as error:
        if error.status != 409:
            abort(error.status, str(error))
        return render_template("chat/features.html", problem=str(error), **common), 409
    return render_template("chat/features.html", problem=None, tables=labelled(model, readings), model=model,
                           **common)


@bp.get("/c/<conversation_id>/m/<int:message_id>/features/<int:index>.json")
def token_features_json(conversation_id: str, message_id: int, index: int) -> ResponseReturnValue:
    return answer(owned_message(conversation_id, message_id), index)


@bp.get("/shared/<token>/m/<int:message_id>/features/<int:index>.json")
def shared_token_features_json(token: str, message_id: int, index: int) -> ResponseReturnValue:
    _, message = shared_message(token, message_id)
    return answer(message, index)


def answer(message: Message, index: int) -> ResponseReturnValue:
    """{"dictionaries": [{"name", "hook_name", "features": [{"index", "activation", "label"}]}]}."""
    try:
        model, readings = resolved(message, index)
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    return jsonify({"dictionaries": [
        {"name": r.dictionary, "hook_name": r.hook_name,
         "features": [{"index": i, "activation": a, "label": label} for i, a, label in rows]}
        for r, rows in labelled(model, readings)]})


def resolved(message: Message, index: int) -> tuple[str, tuple[Reading, ...]]:
    """(the model that wrote the reply, the readings): kept, or read now by a job this request waits for.
    Raises InsideError: 404, 409 (cannot run here, not finished, no dictionary), 429/503, 500."""
    features = feature_service()
    model = runnable_writer(message, "Features cannot be read on")
    details = service().details(message.id)
    try:
        wanted = features.request_for(model, message, details, index)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    found = features.report(model, wanted, details)  # kept, or saved with the reply
    if found is not None:
        return model, found
    return model, report_or_wait(features, model, wanted, "read this token's features")  # a follower: never a job


# -- one feature's page -------------------------------------------------------------------------------
@bp.get("/features/<model>/<dictionary>/<int:index>.json")
def feature_json(model: str, dictionary: str, index: int) -> ResponseReturnValue:
    """{"index", "label", "density", "pushes": [{"token", "logit"}], "pulls": [{"token", "logit"}] (pushed down,
    the most first), "top_contexts": [{"activation", "at", "tokens": [texts]}], "histogram": {"edges": [...],
    "counts": [...]}, "fired_in": [{"conversation_id", "message_id", "title", "token", "activation"}]}; density,
    top_contexts and histogram null where the dictionary has no statistics (histogram: no histogram in them);
    fired_in: the asker's own replies only."""
    return jsonify(feature_view(model, dictionary, index))


@bp.get("/features/<model>/<dictionary>/<int:index>")
def feature_page(model: str, dictionary: str, index: int) -> ResponseReturnValue:
    page = render_template("chat/feature.html", model=model, dictionary=dictionary, error=request.args.get("error"),
                           label_chars=LABEL_CHARS, **feature_view(model, dictionary, index))
    return show_followers_everywhere(page, f"feature {index} of {dictionary}")


@bp.post("/features/<model>/<dictionary>/<int:index>/label")
def write_label(model: str, dictionary: str, index: int) -> ResponseReturnValue:
    """label=<text>: the feature's written label, shared with everyone here (blank: back to the automatic one)."""
    loaded_feature(model, dictionary, index)
    if "label" not in request.form:
        abort(400, "Send the label (blank: back to the automatic one).")
    try:
        feature_service().write_label(model, dictionary, index, request.form["label"], owner_id())
    except ChatError as error:
        return redirect(url_for("chat.feature_page", model=model, dictionary=dictionary, index=index,
                                error=str(error)), 303)
    return redirect(url_for("chat.feature_page", model=model, dictionary=dictionary, index=index), 303)


@bp.post("/features/<model>/<dictionary>/<int:index>/label.json")
@csrf_exempt
def write_label_json(model: str, dictionary: str, index: int) -> ResponseReturnValue:
    """{"label": <text>} (blank: none) -> the feature as its JSON shows it."""
    loaded_feature(model, dictionary, index)
    body = request.get_json(silent=True) if request.is_json else None
    if not isinstance(body, dict) or "label" not in body:
        return jsonify({"error": 'Send a JSON object: {"label": "<text>"} (blank: back to the automatic one).'}), 400
    try:
        feature_service().write_label(model, dictionary, index, body["label"], owner_id())
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status
    return jsonify(feature_view(model, dictionary, index))


@bp.get("/features/<model>/search")
def search_page(model: str) -> ResponseReturnValue:
    """?q=<words>: the model's features whose label holds them; ?text=<text>: the features of each of its tokens
    (the request waits for its job: no JavaScript needed)."""
    query, found = searched(model)
    text = request.args.get("text", "")
    tokens, error, status, headers = None, None, 200, {}
    if text.strip():
        try:
            tokens = [(token, whitespace_name(token), rows) for token, rows in text_rows(model, text, PANEL_FEATURES)]
        except InsideError as refused:
            error, status, headers = str(refused), refused.status, refused.headers
    return render_template("chat/feature_search.html", model=model, query=query, found=found, most=SEARCH_RESULTS,
                           text=text, tokens=tokens, error=error, text_tokens=TEXT_TOKENS), status, headers


@bp.get("/features/<model>/text.json")
def text_json(model: str) -> ResponseReturnValue:
    """?text=<text> -> {"text", "tokens": [{"token", "dictionaries": [{"name", "hook_name", "features": [{"index",
    "activation", "label"}]}]}]}: each token's features, strongest first, read at its own place after the start
    token."""
    searched(model)
    text = request.args.get("text", "")
    try:
        rows = text_rows(model, text)
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    return jsonify({"text": text, "tokens": [
        {"token": token, "dictionaries": [
            {"name": r.dictionary, "hook_name": r.hook_name,
             "features": [{"index": i, "activation": a, "label": label} for i, a, label in found]}
            for r, found in labelled_rows]} for token, labelled_rows in rows]})


def text_rows(model: str, text: str, top: int | None = None
              ) -> list[tuple[str, list[tuple[Reading, list[tuple[int, float, str]]]]]]:
    """Each token of a typed text with its readings, labelled (the `top` strongest). Raises InsideError: 400 (no
    text, too long), 429/503 (refused, still running), 500."""
    features = feature_service()
    try:
        wanted = features.text_request(model, text)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    found = report_or_wait(features.texts, model, wanted, "read this text's features")
    tokenizer = service().models.get(model).tokenizer
    labels = {name: features.label_of(model, name) for name in service().models.get(model).dictionaries}  # read once
    return [(token_text(tokenizer, t), labelled(model, readings, top, labels))
            for t, readings in zip(wanted.ids[1:], found)]


@bp.get("/features/<model>/search.json")
def search_json(model: str) -> ResponseReturnValue:
    """?q=<text> -> {"query", "features": [{"dictionary", "index", "label", "written"}]}."""
    query, found = searched(model)
    return jsonify({"query": query, "features": found})


def searched(model: str) -> tuple[str, list[FoundFeature]]:
    models = service().models
    if model not in models or not models.get(model).dictionaries:
        abort(404, f"No model {model[:64]!r} with a sparse dictionary here.")
    query = request.args.get("q", "").strip()
    if len(query) > LABEL_CHARS:
        abort(400, f"Search for at most {LABEL_CHARS} characters.")
    return query, feature_service().search(model, query) if query else []


def feature_view(model: str, dictionary: str, index: int) -> dict[str, Any]:
    """What a feature's page and JSON show, from the dictionary as loaded (nothing runs). 404 for no such one."""
    loaded, found = loaded_feature(model, dictionary, index)
    written = feature_service().written_labels(model, dictionary).get(index)
    stats = found.stats
    contexts = None
    if stats is not None:
        contexts = [{"activation": place["activation"], "at": place["at"],
                     "tokens": [token_text(loaded.tokenizer, t) for t in place["tokens"]]}
                    for place in stats["top"][index]]
    histogram = (stats or {}).get("histogram")
    fired_in = feature_service().fired_in(owner_id(), model, dictionary, index)
    return {"index": index, "label": written.text if written else found.labels[index],
            "automatic_label": found.labels[index],
            "written_label": {"text": written.text, "by_you": written.owner == owner_id()} if written else None,
            "hook_name": found.hook_name, "fired_in": fired_in,
            "density": stats["density"][index] if stats is not None else None,
            "pushes": [{"token": token_text(loaded.tokenizer, t), "logit": v} for t, v in found.pushes[index]],
            "pulls": [{"token": token_text(loaded.tokenizer, t), "logit": v} for t, v in found.pulls[index]]
            if found.pulls else [],
            "top_contexts": contexts,
            "histogram": {"edges": histogram["edges"], "counts": histogram["counts"][index]}
            if isinstance(histogram, dict) else None}


def loaded_feature(model: str, dictionary: str, index: int) -> tuple[LoadedChatModel, LoadedDictionary]:
    """The model and dictionary of a feature. 404 for no such model, dictionary or feature."""
    models = service().models
    loaded = models.get(model) if model in models else None
    found = (loaded.dictionaries or {}).get(dictionary) if loaded is not None else None
    if loaded is None or found is None:
        abort(404, f"No dictionary {dictionary[:64]!r} on a model {model[:64]!r} here.")
    if not 0 <= index < found.sae.config.d_sae:
        abort(404, f"The dictionary {dictionary!r} has features 0 to {found.sae.config.d_sae - 1}.")
    return loaded, found
