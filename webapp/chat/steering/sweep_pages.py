"""Sweep α: a reply written again at several strengths of one direction, each a steered version of its own,
shown side by side with the original and filling in as each version ends (the form under a reply and its
page; the JSON twin, steer_sweep.json). The versions stream as every reply does; this page only reads them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from flask import abort, jsonify, redirect, render_template, request, url_for

from webapp.chat.interventions import Steering
from webapp.chat.records import Conversation, Message, ReplyDetails
from webapp.chat.service import ChatError
from webapp.chat.steering.pages import steering
from webapp.chat.web import token_views as glass
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, owned_page, service, settings
from webapp.chat.web.glass import reply_details, tokenizer_of
from webapp.chat.web.presenter_view import show_followers
from webapp.chat.web.share import shared_reply
from webapp.core import Refused
from webapp.web import is_htmx, quotas, refusal_headers, refusal_status
from webapp.web.security import csrf_json_or_form, owner_id

MAX_SWEEP = 9  # strengths one sweep writes
SEPARATORS = re.compile(r"[\s,;]+")


class SweepCut(Exception):
    """A sweep refused part way: the versions in `started` go on and are shown; the rest were not started."""

    def __init__(self, message: str, status: int, started: list[int], headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.started, self.headers = status, started, headers or {}


@bp.app_context_processor
def sweep_context() -> dict:
    """sweep_most: the strengths one sweep may write here (the browser's limit of replies at once, at most
    MAX_SWEEP), so the form says so before it is sent."""
    most = settings().max_jobs_per_owner
    return {"sweep_most": min(MAX_SWEEP, most) if most else MAX_SWEEP}


def parse_alphas(text: str) -> list[float]:
    """"-8, -4, 0, 4, 8" (commas, spaces or semicolons; a typographic minus too) -> the strengths. Raises
    ChatError (400) naming the entry that is not a number; the range is the steering service's check."""
    alphas = []
    for entry in SEPARATORS.split(text.replace("\u2212", "-").strip()):
        if not entry:
            continue
        try:
            alphas.append(float(entry))
        except ValueError:
            raise ChatError(f"Strengths are numbers separated by commas or spaces; {entry[:20]!r} is not one.",
                            400) from None
    return alphas


def start_sweep(conversation_id: str, message_id: int, direction: object, alphas: object) -> list[int]:
    """Every strength checked (count, range, the direction, the browser's job limit) before the first version
    is started -> the new versions' ids, in the order of `alphas`. Raises ChatError (400, 404, 409) when
    nothing was started, SweepCut when the browser's quota or the core refused part way."""
    if not isinstance(alphas, list) or not 2 <= len(alphas) <= MAX_SWEEP:
        raise ChatError(f"A sweep writes 2 to {MAX_SWEEP} strengths: give 2 to {MAX_SWEEP} numbers.", 400)
    page = owned_page(conversation_id)
    assert page.conversation is not None
    message = owned_message(conversation_id, message_id)
    turns = [steering().reply_turn(page.conversation, message, page.messages,
                                   [{"direction": direction, "alpha": alpha}]) for alpha in alphas]
    most = settings().max_jobs_per_owner
    if most and len(turns) > most:
        raise ChatError(f"This server runs at most {most} replies of one browser at once: sweep at most {most} "
                        "strengths.", 400)
    owner, ids = owner_id(), []
    for turn in turns:
        try:
            quotas.check_chat(service().store, owner, new_conversation=False)
            ids.append(service().start_turn(owner, turn).reply_id)
        except ChatError as error:
            if not ids:
                raise
            raise SweepCut(str(error), error.status, ids) from None
        except Refused as error:
            raise SweepCut(str(error), refusal_status(error), ids, refusal_headers(error)) from None
    return ids


@bp.post("/c/<conversation_id>/m/<int:message_id>/steer_sweep.json")
@csrf_json_or_form
def steer_sweep_json(conversation_id: str, message_id: int):
    """{"direction": <name>, "alphas": [-8, -4, 0, 4, 8]} -> {"message_ids": [one new version per strength]}: the
    reply written again at each strength, each a version of its own that streams as every reply does."""
    body = request.get_json(silent=True) if request.is_json else None
    if not isinstance(body, dict) or not isinstance(body.get("alphas"), list):
        return jsonify({"error": f'Send {{"direction": <name>, "alphas": [2 to {MAX_SWEEP} numbers]}}.'}), 400
    try:
        ids = start_sweep(conversation_id, message_id, body.get("direction"), body["alphas"])
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status
    except SweepCut as cut:  # the versions already started go on: they are said too
        return jsonify({"error": str(cut), "message_ids": cut.started}), cut.status, cut.headers
    return jsonify({"message_ids": ids})


@bp.post("/c/<conversation_id>/m/<int:message_id>/steer_sweep")
def steer_sweep_form(conversation_id: str, message_id: int):
    """direction=<name>, alphas="-8 -4 0 4 8" -> the sweep's page (303), which fills in as the versions end."""
    try:
        ids = start_sweep(conversation_id, message_id, request.form.get("direction", ""),
                          parse_alphas(request.form.get("alphas", "")))
    except ChatError as error:
        abort(error.status, str(error))
    except SweepCut as cut:  # the page shows the versions started, and why the rest were not
        original, details = reply_details(conversation_id, message_id)
        return (sweep_view(owned_conversation(conversation_id), original, details, cut.started, str(cut)),
                cut.status, cut.headers)
    return redirect(url_for("chat.steer_sweep_page", conversation_id=conversation_id, message_id=message_id,
                            v=",".join(map(str, ids))), 303)


@dataclass(frozen=True)
class SweepColumn:
    """One version in the sweep: its strength, and its tokens once it has ended (its text so far before)."""

    message: Message
    alpha: float | None  # None: the original
    tokens: list[glass.TokenView]
    first: int | None  # where it first differs from the original (None: it does not, or not yet)


@bp.get("/c/<conversation_id>/m/<int:message_id>/sweep")
def steer_sweep_page(conversation_id: str, message_id: int):
    """?v=<id>,<id>,...: the original reply and its steered versions, by strength; a fragment for htmx's poll."""
    original, details = reply_details(conversation_id, message_id)  # the browser's, or 404
    page = sweep_view(owned_conversation(conversation_id), original, details, sweep_ids())
    return show_followers(page, conversation_id, message_id, "sweep", "a sweep of strengths", keep=("v",))


@bp.get("/shared/<token>/m/<int:message_id>/sweep")
def shared_steer_sweep_page(token: str, message_id: int):
    """The same, read-only, through a share or follow link (the presenter's sweep on the room's screens)."""
    conversation, original, details = shared_reply(token, message_id)
    return sweep_view(conversation, original, details, sweep_ids(), shared=token)


def sweep_ids() -> list[int]:
    """?v=<id>,<id>,...: the sweep's versions, by number (400 unless 1 to MAX_SWEEP numbers)."""
    try:
        ids = [int(v) for v in request.args.get("v", "").split(",") if v.strip()]
    except ValueError:
        abort(400, "v lists the sweep's versions by number, separated by commas.")
    if not 1 <= len(ids) <= MAX_SWEEP:
        abort(400, f"v lists 1 to {MAX_SWEEP} versions of this reply.")
    return ids


def sweep_view(conversation: Conversation, original: Message, details: ReplyDetails, ids: list[int],
               error: str | None = None, shared: str | None = None):
    tree = {m.id: m for m in service().all_messages(conversation.id)}
    versions = []
    for v in dict.fromkeys(ids):
        version = tree.get(v)
        change = _steering_of(version) if version is not None and version.parent_id == original.parent_id \
            and version.is_reply else None
        if version is None or change is None or len(change.terms) != 1 or change.clamps:
            abort(404, f"Message {v} is not a version of this reply steered along one direction.")
        versions.append((change.terms[0].alpha, version))
    versions.sort(key=lambda pair: pair[0])
    finished = [m.id for _, m in versions if not m.pending]
    every = service().details_of(finished) if finished else {}
    base = glass.readable_token_views(tokenizer_of(original), details)[0]
    columns = [SweepColumn(original, None, base, None)]
    for alpha, message in versions:
        tokens = [] if message.pending else glass.readable_token_views(tokenizer_of(message), every[message.id])[0]
        first = glass.first_difference(base, tokens) if tokens else None
        columns.append(SweepColumn(message, alpha, tokens, first))
    terms = _steering_of(versions[0][1])
    assert terms is not None
    listed = ",".join(str(m.id) for _, m in versions)
    poll = (url_for("chat.shared_steer_sweep_page", token=shared, message_id=original.id, v=listed) if shared else
            url_for("chat.steer_sweep_page", conversation_id=conversation.id, message_id=original.id, v=listed))
    context = dict(conversation=conversation, original=original, columns=columns, term=terms.terms[0],
                   live=any(c.message.pending for c in columns), error=error, poll=poll, shared=shared)
    if is_htmx() and error is None:
        return render_template("chat/_steer_sweep.html", **context)
    return render_template("chat/steer_sweep.html", **context)


def _steering_of(message: Message) -> Steering | None:
    try:
        change = message.change
    except ValueError:  # a record this code did not write: not a sweep's version
        return None
    return change if isinstance(change, Steering) else None
