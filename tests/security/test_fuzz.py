"""Property-based fuzzing of what people send: the Loop-lab request parser and its form, the chat
form parsers and /chat/send. Whatever arrives, the answer is a result or one of the documented
messages - never a 500, never another exception."""

from __future__ import annotations

import math
import re
import string

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import make_app
from webapp.chat.decode.types import SamplingParams
from webapp.chat.web.forms import SEED_MAX, TOP_K_MAX, FormError, parse_content, parse_sampling
from webapp.loops.request import DemoRequest, RequestError
from webapp.web.state import glassbox

LETTERS = string.ascii_uppercase
LOOP_MESSAGES = ["Supply exactly mapping, start, and steps", "Supply all 26 A–Z rules, with one destination per node",
                 "Each rule must be a pair of uppercase A–Z letters", "Each A–Z source must occur exactly once",
                 "Start must be an uppercase A–Z letter", "Steps must be an integer from 1 to 256"]
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-300, 300) | st.floats() | st.text(max_size=4)
    | st.sampled_from(list(LETTERS) + ["a", "AA", "", "Ä"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)


@st.composite
def near_valid_requests(draw):
    """A valid request with a few things broken: the inputs that reach the later checks."""
    sources = draw(st.permutations(list(LETTERS)))
    value = {"mapping": [[s, draw(st.sampled_from(LETTERS))] for s in sources],
             "start": draw(st.sampled_from(LETTERS)), "steps": draw(st.integers(1, 256))}
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.sampled_from(["key", "mapping", "rule", "part", "start", "steps", "drop", "extra"]))
        if what in ("key", "start", "steps"):
            value[draw(st.sampled_from(["mapping", "start", "steps"])) if what == "key" else what] = draw(json_values)
        elif what == "mapping":
            value["mapping"] = draw(json_values)
        elif what in ("rule", "part") and isinstance(value.get("mapping"), list) and value["mapping"]:
            i = draw(st.integers(0, len(value["mapping"]) - 1))
            if what == "rule" or not isinstance(value["mapping"][i], list) or not value["mapping"][i]:
                value["mapping"][i] = draw(json_values)
            else:
                value["mapping"][i][0] = draw(st.sampled_from(LETTERS) | json_values)
        elif what == "drop":
            value.pop(draw(st.sampled_from(["mapping", "start", "steps"])), None)
        else:
            value[draw(st.text(max_size=5))] = draw(json_values)
    return value


def reference_message(value) -> str | None:
    """The owner's checks, in the owner's order, written out again from DESIGN.md as the oracle."""
    letter = lambda x: isinstance(x, str) and len(x) == 1 and x in LETTERS  # noqa: E731
    if not isinstance(value, dict) or set(value) != {"mapping", "start", "steps"}:
        return LOOP_MESSAGES[0]
    rules = value["mapping"]
    if not isinstance(rules, list) or len(rules) != 26:
        return LOOP_MESSAGES[1]
    if not all(isinstance(r, list) and len(r) == 2 and letter(r[0]) and letter(r[1]) for r in rules):
        return LOOP_MESSAGES[2]
    if sorted(r[0] for r in rules) != list(LETTERS):
        return LOOP_MESSAGES[3]
    if not letter(value["start"]):
        return LOOP_MESSAGES[4]
    steps = value["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 256:
        return LOOP_MESSAGES[5]
    return None


@settings(FUZZ, max_examples=400)
@given(st.one_of(json_values, near_valid_requests()))
def test_the_loop_request_parser_gives_the_owners_answer_for_anything(value):
    expected = reference_message(value)
    try:
        parsed = DemoRequest.parse(value)
    except RequestError as error:
        event(error.message)
        assert error.message == expected and error.field in {"request", "mapping", "start", "steps"}
        return
    assert expected is None
    assert len(parsed.pairs) == 26 and parsed.start in LETTERS and 1 <= parsed.steps <= 256
    assert DemoRequest.parse(parsed.payload()) == parsed  # what it accepted, it accepts again


form_text = st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
                      st.integers(-10**6, 10**6).map(str), st.floats().map(str), st.sampled_from(["", " ", "1e999"]))


@settings(FUZZ, max_examples=300)
@given(st.dictionaries(st.sampled_from(["content", "temperature", "top_k", "max_new_tokens", "seed", "other"]),
                       form_text))
def test_the_chat_form_parsers_give_a_bounded_result_or_a_documented_message(form):
    try:
        content = parse_content(form, 8000)
        assert content.strip() and "\x00" not in content and len(content) <= 8000
    except FormError as error:
        assert error.field == "content" and error.message in (
            "Write a message first.", "Messages cannot contain NUL characters.") or \
            re.fullmatch(r"Messages are limited to 8,000 characters; this one has [\d,]+\.", error.message)
    try:
        sampling = parse_sampling(form, default_max_new_tokens=200, max_new_tokens_limit=300)
    except FormError as error:
        assert error.message == {
            "temperature": "Temperature must be a number from 0 to 2.",
            "top_k": f"Top-k must be a whole number from 0 to {TOP_K_MAX} (0 means the whole vocabulary).",
            "max_new_tokens": "Max new tokens must be a whole number from 1 to 300.",
            "seed": f"Seed must be empty or a whole number from 0 to {SEED_MAX}."}[error.field]
        return
    assert isinstance(sampling, SamplingParams) and math.isfinite(sampling.temperature)
    assert 0 <= sampling.temperature <= 2 and 0 <= sampling.top_k <= TOP_K_MAX
    assert 1 <= sampling.max_new_tokens <= 300 and (sampling.seed is None or 0 <= sampling.seed <= SEED_MAX)


# -- through the views ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from tests.support.chat_models import tiny_chat_model
    from tests.support.loop_models import bundle
    tmp = tmp_path_factory.mktemp("fuzz")
    app = make_app(tmp, {"chat": tiny_chat_model(tmp / "chat"), "loops": bundle()},
                   max_jobs_per_owner=10_000, max_queue=10_000)
    yield app
    glassbox(app).core.shutdown(timeout=5)


@pytest.fixture(scope="module")
def client(app):
    client = app.test_client()
    page = client.get("/loops/").get_data(as_text=True)
    client.csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    return client


def error_messages(html: str) -> list[str]:
    from html import unescape
    return [unescape(m) for m in re.findall(r'class="error"[^>]*>([^<]*)<', html)]


letters_or_junk = st.one_of(st.sampled_from(LETTERS), form_text)


@settings(FUZZ, max_examples=60)
@given(src=st.one_of(st.permutations(list(LETTERS)), st.lists(letters_or_junk, max_size=30)),
       dst=st.one_of(st.lists(st.sampled_from(LETTERS), min_size=26, max_size=26),
                     st.lists(letters_or_junk, max_size=30)),
       start=letters_or_junk, steps=st.one_of(st.integers(-5, 300).map(str), form_text), htmx=st.booleans())
def test_the_loop_lab_form_answers_a_run_or_a_documented_message(client, src, dst, start, steps, htmx):
    data = {"csrf_token": client.csrf, "src": list(src), "dst": dst, "start": start, "steps": steps}
    response = client.post("/loops/run", data=data, headers={"HX-Request": "true"} if htmx else {})
    html = response.get_data(as_text=True)
    event(f"status {response.status_code}")  # --hypothesis-show-statistics: were both paths reached?
    if response.status_code == 400:
        messages = error_messages(html)
        assert len(messages) == 1 and messages[0] in LOOP_MESSAGES, messages
    else:
        assert response.status_code in ((200,) if htmx else (200, 303)), html[:500]
        assert ("sse-connect" in html) if htmx else True


@settings(FUZZ, max_examples=60)
@given(form=st.dictionaries(st.sampled_from(["content", "temperature", "top_k", "max_new_tokens", "seed"]), form_text),
       content=st.one_of(st.none(), st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60)),
       conversation_id=st.one_of(st.none(), st.none(), st.none(), form_text))
def test_chat_send_answers_a_reply_or_a_documented_message(client, form, content, conversation_id):
    if content is not None:
        form["content"] = content
    if conversation_id is not None:
        form["conversation_id"] = conversation_id
    form.setdefault("max_new_tokens", "2")
    response = client.post("/chat/send", data={**form, "csrf_token": client.csrf}, headers={"HX-Request": "true"})
    html = response.get_data(as_text=True)
    event(f"status {response.status_code}")
    if response.status_code == 404:
        assert form.get("conversation_id") and "No such conversation." in html
    elif response.status_code == 400:
        messages = error_messages(html)  # every bad field says so at once, each beside its field
        assert messages and len(messages) == len(set(messages)), messages
        for message in messages:
            assert re.fullmatch(r"Write a message first\.|Messages cannot contain NUL characters\."
                                r"|Messages are limited .*"
                                r"|Temperature must .*|Top-k must .*|Max new tokens must .*|Seed must .*"
                                r"|Your message is \d+ tokens? too long for this model.*"
                                r"|With this message \([\d,]+ tokens\) at most [\d,]+ new tokens fit\."
                                r"|This message \([\d,]+ tokens\) leaves no room for a reply: shorten it\.",
                                message), message
    else:
        # the reply streams, or (a tiny model, two tokens) had already finished when the page was drawn
        assert response.status_code == 200, html[:500]
        assert "sse-connect" in html or re.search(r'class="message assistant complete"', html), html[:500]
