"""The composer's sampling form: every error at once with what was typed, the reply-length bound
explained, settings remembered per browser with a reset (issue 14, item 2)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import csrf_of
from webapp.chat.web.forms import FormErrors, parse_message, parse_sampling, remembered_sampling
from webapp.web.state import glassbox

BAD = {"temperature": "5", "top_k": "-3", "max_new_tokens": "99999", "seed": "abc"}


def send(client, content="my draft", csrf=None, htmx=True, **fields):
    csrf = csrf or csrf_of(client, "/chat/")
    return client.post("/chat/send", data={"csrf_token": csrf, "content": content, **fields},
                       headers={"HX-Request": "true"} if htmx else {})


def value_of(html: str, name: str) -> str:
    return re.search(rf'name="{name}" type="text" inputmode="decimal" value="([^"]*)"', html).group(1)


def test_every_bad_sampling_field_is_named_at_once():
    with pytest.raises(FormErrors) as caught:
        parse_sampling(BAD, default_max_new_tokens=200, max_new_tokens_limit=300)
    assert set(caught.value.errors) == set(BAD)
    assert caught.value.field == "temperature"  # the first, for callers that show one


def test_the_message_and_its_settings_are_checked_together():
    with pytest.raises(FormErrors) as caught:
        parse_message({"content": " ", "seed": "x"}, 100, default_max_new_tokens=5, max_new_tokens_limit=9)
    assert set(caught.value.errors) == {"content", "seed"}
    content, sampling = parse_message({"content": "hi", "top_k": "3"}, 100, default_max_new_tokens=5,
                                      max_new_tokens_limit=9)
    assert content == "hi" and sampling.top_k == 3 and sampling.max_new_tokens == 5


def test_remembered_settings_are_checked_again_and_clamped_to_todays_limit():
    kept = remembered_sampling({"temperature": 0.3, "top_k": 7, "max_new_tokens": 900, "seed": None},
                               default_max_new_tokens=200, max_new_tokens_limit=300)
    assert (kept.temperature, kept.top_k, kept.max_new_tokens, kept.seed) == (0.3, 7, 300, None)
    assert remembered_sampling({"temperature": "hot"}, default_max_new_tokens=2, max_new_tokens_limit=3) is None
    assert remembered_sampling("junk", default_max_new_tokens=2, max_new_tokens_limit=3) is None


@pytest.mark.parametrize("htmx", [True, False])
def test_all_four_errors_show_beside_their_fields_with_the_values_kept(chat_app, htmx):
    client = chat_app.test_client()
    response = send(client, "keep me", htmx=htmx, **BAD)
    html = response.get_data(as_text=True)
    assert response.status_code == 400
    for name, typed in BAD.items():
        assert f'id="{name}-error"' in html, name
        assert value_of(html, name) == typed
        # beside its field: the error follows its input inside the same .field
        field = re.search(rf'<div class="field field-{name}">(.*?)</div>', html, re.S).group(1)
        assert f'id="{name}-error"' in field and 'aria-invalid="true"' in field
    assert re.search(r'<details class="sampling" id="sampling" open', html)  # the panel is opened
    assert "keep me" in html
    assert glassbox(chat_app).core.counters["submitted"] == 0


def test_a_message_error_alone_leaves_the_panel_closed(chat_app):
    html = send(chat_app.test_client(), "   ").get_data(as_text=True)
    assert 'id="content-error"' in html and not re.search(r'id="sampling" open', html)


def test_too_long_for_the_window_says_how_many_new_tokens_fit_and_opens_the_panel(chat_app):
    client = chat_app.test_client()
    response = send(client, "y" * 200, max_new_tokens="100")
    html = response.get_data(as_text=True)
    assert response.status_code == 400
    from webapp.chat.web.conversations import service
    with chat_app.app_context():
        most = service().prompts.budget(0) - 202  # 200 bytes + the two turn markers
    assert most > 0 and f"With this message (202 tokens) at most {most} new tokens fit." in html
    assert 'id="content-error"' in html and re.search(r'id="sampling" open', html)


def test_the_reply_length_bound_is_explained_against_the_window(chat_app):
    client = chat_app.test_client()
    html = client.get("/chat/").get_data(as_text=True)
    from webapp.chat.web.conversations import service
    with chat_app.app_context():
        prompts, limit = service().prompts, service().max_new_tokens_limit()
    room = prompts.budget(0)
    hint = re.sub(r"\s+", " ", re.search(r'id="max_new_tokens-hint">(.*?)</p>', html, re.S).group(1))
    assert f"reads {prompts.block_size} tokens" in hint and f"share {room}" in hint
    assert f"The most, {limit}, leaves room for a one-word message only." in hint
    assert 'aria-describedby="max_new_tokens-hint"' in html


def test_settings_are_remembered_for_this_browser_and_reset_on_request(chat_app):
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    response = send(client, "hello", csrf, htmx=False, temperature="0.3", top_k="7", max_new_tokens="5", seed="9")
    assert response.status_code == 303
    page = client.get("/chat/").get_data(as_text=True)
    assert [value_of(page, n) for n in ("temperature", "top_k", "max_new_tokens", "seed")] == ["0.3", "7", "5", "9"]
    other = chat_app.test_client().get("/chat/").get_data(as_text=True)  # another browser: the defaults
    assert value_of(other, "top_k") == "50" and value_of(other, "seed") == ""
    # reset (htmx): the composer comes back with the defaults and the draft kept
    reset = client.post("/chat/sampling/reset", data={"csrf_token": csrf, "content": "half-written"},
                        headers={"HX-Request": "true"})
    html = reset.get_data(as_text=True)
    assert reset.status_code == 200 and 'id="composer"' in html and "half-written" in html
    assert value_of(html, "top_k") == "50" and value_of(html, "temperature") == "1.0"
    assert value_of(client.get("/chat/").get_data(as_text=True), "seed") == ""
    # without JavaScript: back to the page it came from
    send(client, "again", csrf, htmx=False, top_k="3", max_new_tokens="2")
    plain = client.post("/chat/sampling/reset", data={"csrf_token": csrf})
    assert plain.status_code == 303 and plain.headers["Location"].endswith("/chat/")
    assert value_of(client.get("/chat/").get_data(as_text=True), "top_k") == "50"
