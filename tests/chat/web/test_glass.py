"""The glass-box views of a reply: its tokens with their odds, and the exact prompt the model was given."""

from __future__ import annotations

import html as html_lib
import re

import pytest
import torch

from tests.chat.web.test_conversations import conversation_id_of, send, sent_and_streamed, stream_url
from tests.conftest import csrf_of, make_app, sse_events
from webapp.web.state import glassbox


@pytest.fixture
def chat_app(tmp_path):
    """The tiny test model, made to never stop before max_new_tokens (so every reply has tokens)."""
    from tests.support.chat_models import tiny_chat_model
    loaded = tiny_chat_model(tmp_path / "chat")
    first_special = min(loaded.tokenizer.special_ids.values())
    loaded.model.lm_head.register_forward_hook(lambda m, a, logits: logits.index_fill_(
        -1, torch.arange(first_special, logits.size(-1)), float("-inf")))
    app = make_app(tmp_path, {"chat": loaded})
    yield app
    glassbox(app).core.shutdown()


def reply(client, content, **fields):
    """Send, stream the reply to its end -> (conversation id, reply id, SSE events)."""
    sent = send(client, content, **fields)
    assert sent.status_code == 200, sent.get_data(as_text=True)[:300]
    url = stream_url(sent.get_data(as_text=True))
    events = sse_events(client.get(url).get_data(as_text=True))
    assert events[-1][0] == "done"
    return conversation_id_of(sent), int(re.search(r"/m/(\d+)/stream", url).group(1)), events


def live_reply(app, client, content, **fields):
    """As reply(), its stream opened while the reply is still being written (sent_and_streamed)."""
    sent, events = sent_and_streamed(app, client, lambda: send(client, content, **fields))
    assert sent.status_code == 200 and events[-1][0] == "done"
    url = stream_url(sent.get_data(as_text=True))
    return conversation_id_of(sent), int(re.search(r"/m/(\d+)/stream", url).group(1)), events


def test_the_token_view_shows_every_token_with_its_odds_and_a_panel_without_javascript(chat_app):
    client = chat_app.test_client()
    cid, mid, events = live_reply(chat_app, client, "Hello there", max_new_tokens="12", temperature="0.8",
                                  top_k="20", seed="3")
    tokens_url = f"/chat/c/{cid}/m/{mid}/tokens"
    assert tokens_url in client.get(f"/chat/c/{cid}").get_data(as_text=True)  # linked from the reply
    page = client.get(tokens_url).get_data(as_text=True)
    spans = re.findall(r'<a class="tok s(\d)[^"]*" id="token-(\d+)"', page)
    from webapp.chat.web.conversations import service
    with chat_app.app_context():
        saved = service().store.message(cid, mid)
        odds = service().store.details(mid).odds
    assert len(spans) == saved.tokens == len(odds) and saved.tokens >= 1
    assert [int(i) for _, i in spans] == list(range(len(odds)))
    assert [int(s) for s, _ in spans] == [min(9, int(row[1] * 10)) for row in odds]
    # streamed live too: one span per token, with its probability, as the reply arrived
    streamed = "".join(data for name, data in events if name == "token")
    assert len(re.findall(r'<span class="tok s\d" title="[\d.]+%">', streamed)) == saved.tokens

    chosen = client.get(f"{tokens_url}?t=0").get_data(as_text=True)  # the no-JS way: a link per token
    assert 'id="token-panel"' in chosen and "Token 1:" in chosen and chosen.count("<meter") == 10
    assert "(chosen)" in chosen or odds[0][3] > 10  # the pick is among the ten unless it ranked lower
    panel = client.get(f"{tokens_url}/0", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert panel.lstrip().startswith("<section") and "entropy" in panel and "<html" not in panel
    assert client.get(f"{tokens_url}/{len(odds)}").status_code == 404


def test_the_prompt_view_lists_exactly_the_ids_the_model_received(chat_app):
    client = chat_app.test_client()
    core = glassbox(chat_app).core
    cid, first, _ = reply(client, "x" * 200, max_new_tokens="5", temperature="0")
    # a second turn asking for a long reply: the 202-token first turn no longer fits the 512-token window
    sent = send(client, "And now?", conversation_id=cid, max_new_tokens="150", temperature="0")
    url = stream_url(sent.get_data(as_text=True))
    second = int(re.search(r"/m/(\d+)/stream", url).group(1))
    given = list(core.find("chat", second).request.prompt_ids)  # what the generator was given
    client.get(url).get_data()
    page = client.get(f"/chat/c/{cid}/m/{second}/prompt").get_data(as_text=True)
    shown = [int(i) for i in re.findall(r'<span class="tokid">(\d+)</span>', page)]
    assert shown == given
    assert "Left out to fit the window" in page and html_lib.escape("x" * 200) in page
    fewshot = glassbox(chat_app).core.models["chat"].prompt.fewshot_ids
    assert f"512 − 150 − 2 − {len(fewshot)} = <strong>{512 - 150 - 2 - len(fewshot)}</strong>" in page
    assert "earlier turn" in page and "Few-shot example" in page and "The reply starts here" in page


def test_a_branchs_tokens_per_second_counts_only_what_it_sampled(chat_app):
    """A branch whose typed text fills all but one token of the reply: one sampled token, so no rate
    (its 11 given tokens once made it thousands of tokens/s)."""
    from webapp.chat.web.conversations import service
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="12", temperature="0.9", seed="3")
    csrf = csrf_of(client, f"/chat/c/{cid}")
    typed = client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "2", "text": "123456789"})
    assert typed.status_code == 303
    with chat_app.app_context():
        branch = service().store.messages(cid)[-1]
    assert branch.id != mid and branch.tokens == 12
    assert branch.tokens_per_second is None and branch.ttft_seconds > 0
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    shown = page.split(f'id="message-{branch.id}"')[1].split("</li>")[0]
    assert "12 tokens" in shown and "tokens/s" not in shown


def test_a_special_token_among_the_alternatives_says_it_ends_the_reply_before_it_is_offered(tmp_path):
    """<|user_start|> as the runner-up everywhere: the panel names what it means and offers it as
    "End the reply here", never "Continue with this" (which ended replies mid-word without a word)."""
    from tests.support.chat_models import tiny_chat_model
    from webapp.chat.web.conversations import service
    loaded = tiny_chat_model(tmp_path / "chat")
    specials = loaded.tokenizer.special_ids
    user_start, first_special = specials["<|user_start|>"], min(specials.values())

    def runner_up(module, args, logits):
        top = logits[..., :first_special].topk(2, dim=-1).values
        logits[..., first_special:] = float("-inf")
        logits[..., user_start] = top.mean(dim=-1)  # between the first and the second
        return logits
    loaded.model.lm_head.register_forward_hook(runner_up)
    app = make_app(tmp_path, {"chat": loaded})
    try:
        client = app.test_client()
        cid, mid, _ = reply(client, "Hello there", max_new_tokens="8", temperature="0")
        page = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=3").get_data(as_text=True)
        row = next(r for r in page.split("<tr") if "&lt;|user_start|&gt;" in r)
        assert "a special token: the start of the person&#39;s next turn. Choosing it ends the reply here." in row
        assert f'value="{user_start}">End the reply here</button>' in row and "Continue with this" not in row
        assert page.count("Continue with this") == 8  # the ordinary alternatives, the chosen one excepted
        csrf = csrf_of(client, f"/chat/c/{cid}")
        ended = client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "3",
                                                                    "token": str(user_start)})
        assert ended.status_code == 303
        with app.app_context():
            branch = service().store.messages(cid)[-1]
            original = service().store.message(cid, mid)
        assert branch.id != mid and branch.tokens == 3 and branch.content == original.content[:3]
    finally:
        glassbox(app).core.shutdown()


def test_glass_views_belong_to_the_browser_that_made_the_reply(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(mine, "private", max_new_tokens="3")
    for path in (f"/chat/c/{cid}/m/{mid}/tokens", f"/chat/c/{cid}/m/{mid}/tokens/0", f"/chat/c/{cid}/m/{mid}/prompt"):
        assert mine.get(path).status_code == 200
        assert theirs.get(path).status_code == 404
    assert mine.get(f"/chat/c/{cid}/m/{mid - 1}/tokens").status_code == 404  # the question has no tokens


def test_a_branch_from_a_token_is_the_fresh_generation_from_that_prefix_and_a_new_version(chat_app):
    from webapp.chat.decode.generate import generate
    from webapp.chat.web.conversations import service
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="12", temperature="0.9", top_k="20", seed="3")
    with chat_app.app_context():
        rows = service().store.details(mid).odds
        prompt = service().store.details(mid).prompt["ids"]
    ids = [row[0] for row in rows]
    index = 4
    other = next(t for t, _, _ in rows[index][5] if t != ids[index])  # an alternative not taken
    page = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t={index}").get_data(as_text=True)
    assert f'name="token" value="{other}"' in page  # the panel offers it
    csrf = csrf_of(client, f"/chat/c/{cid}")
    branched = client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": str(index),
                                                                  "token": str(other)})
    assert branched.status_code == 303  # without JavaScript: after the whole reply
    with chat_app.app_context():
        shown = service().store.messages(cid)
        new = shown[-1]
        new_ids = [row[0] for row in service().store.details(new.id).odds]
    assert new.id != mid and new.versions == (mid, new.id) and new.version == 2
    assert new_ids[:index + 1] == ids[:index] + [other] and len(new_ids) == 12
    loaded = glassbox(chat_app).core.models["chat"]
    fresh = [p.token for p in generate(loaded, prompt + new_ids[:index + 1], max_new_tokens=12 - index - 1,
                                       temperature=0.9, top_k=20, seed=3) if p.token is not None]
    assert new_ids[index + 1:] == fresh

    typed = client.post(f"/chat/c/{cid}/m/{new.id}/branch", data={"csrf_token": csrf, "index": "2", "text": "ok!"})
    assert typed.status_code == 303
    with chat_app.app_context():
        third = service().store.messages(cid)[-1]
        third_rows = service().store.details(third.id).odds
    assert [r[0] for r in third_rows[:5]] == new_ids[:2] + list(b"ok!") and third.version == 3
    assert third_rows[2][1] is None  # typed, not sampled: no odds of its own
    assert "typed into a branch" in client.get(f"/chat/c/{cid}/m/{third.id}/tokens?t=2").get_data(as_text=True)

    bad = client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "99", "token": "1"})
    assert bad.status_code == 400 and "there is no token 100" in bad.get_data(as_text=True)


def test_two_versions_side_by_side_show_where_they_first_differ(chat_app):
    from webapp.chat.web.conversations import service
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Compare us", max_new_tokens="10", temperature="1.0", top_k="0", seed="11")
    with chat_app.app_context():
        rows = service().store.details(mid).odds
    other = next(t for t, _, _ in rows[3][5] if t != rows[3][0])
    csrf = csrf_of(client, f"/chat/c/{cid}")
    client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "3", "token": str(other)})
    with chat_app.app_context():
        new = service().store.messages(cid)[-1]
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    compare_url = f"/chat/c/{cid}/m/{new.id}/compare/{mid}"
    assert compare_url in page  # linked from the version switcher
    html = client.get(compare_url).get_data(as_text=True)
    assert "They share their first 3 tokens and first differ at token 4." in html
    assert html.count('class="token-panel"') == 2 and 'id="token-panel-1"' in html and 'id="token-panel-2"' in html
    assert client.get(f"/chat/c/{cid}/m/{new.id}/compare/{mid - 1}").status_code == 404  # not a sibling


def test_a_reply_can_be_read_as_its_tokens_in_place_and_the_choice_is_kept(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Token view please", max_new_tokens="6", seed="2")
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert '<button type="submit">Show tokens' in page and '<p class="text token-view">' not in page
    csrf = csrf_of(client, f"/chat/c/{cid}")
    fragment = client.post(f"/chat/c/{cid}/m/{mid}/view", data={"csrf_token": csrf, "view": "tokens"},
                           headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.lstrip().startswith(f'<li class="message assistant complete" id="message-{mid}"')
    assert fragment.count('<a class="tok s') == 6 and 'class="on">Hide tokens' in fragment
    again = client.get(f"/chat/c/{cid}").get_data(as_text=True)  # kept with the reply
    assert again.count('<a class="tok s') == 6
    other = chat_app.test_client()
    assert other.get(f"/chat/c/{cid}").status_code == 404  # (another browser cannot see it at all)
    back = client.post(f"/chat/c/{cid}/m/{mid}/view", data={"csrf_token": csrf, "view": "text"})
    assert back.status_code == 303
    assert '<a class="tok s' not in client.get(f"/chat/c/{cid}").get_data(as_text=True)


def test_every_version_offers_a_comparison_and_a_difference_at_the_first_token_is_said_plainly(chat_app):
    from webapp.chat.web.conversations import service
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Compare us", max_new_tokens="6", temperature="1.0", top_k="0", seed="11")
    with chat_app.app_context():
        rows = service().store.details(mid).odds
    other = next(t for t, _, _ in rows[0][5] if t != rows[0][0])
    csrf = csrf_of(client, f"/chat/c/{cid}")
    client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "0", "token": str(other)})
    with chat_app.app_context():
        new = service().store.messages(cid)[-1].id
    later = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert f'href="/chat/c/{cid}/m/{new}/compare/{mid}">Compare with 1</a>' in later
    client.post(f"/chat/c/{cid}/m/{mid}/show", data={"csrf_token": csrf})  # switch back to version 1
    earlier = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert f'href="/chat/c/{cid}/m/{mid}/compare/{new}">Compare with 2</a>' in earlier  # the first version too
    html = client.get(f"/chat/c/{cid}/m/{mid}/compare/{new}").get_data(as_text=True)
    assert "They differ from their first token on." in html and "first 0 tokens" not in html
    # a third version: any two can be compared (one pair only was offered), the one before chosen first
    sent = client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "1", "text": "zz"})
    assert sent.status_code == 303
    with chat_app.app_context():
        third = service().store.messages(cid)[-1].id
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    form = page[page.index(f'action="/chat/c/{cid}/m/{third}/compare"'):]
    form = form[:form.index("</form>")]
    assert re.findall(r'<option value="(\d+)"( selected)?>(\d)</option>', form) == [
        (str(mid), "", "1"), (str(new), " selected", "2")]
    chosen = client.get(f"/chat/c/{cid}/m/{third}/compare", query_string={"other": mid})
    assert chosen.status_code == 303 and chosen.headers["Location"].endswith(f"/m/{third}/compare/{mid}")
    assert client.get(f"/chat/c/{cid}/m/{third}/compare?other=x").status_code == 400


def test_counts_agree_with_their_nouns_and_the_composer_and_prompt_page_tell_the_same_arithmetic(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "One", max_new_tokens="1")
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert '<span class="stats">1 token' in page and "1 tokens" not in page
    fewshot = len(glassbox(chat_app).core.models["chat"].prompt.fewshot_ids)
    composer = re.sub(r"\s+", " ", page)
    assert (f"The model reads 512 tokens at a time; {fewshot} are its built-in (few-shot) examples and 2 the start "
            f"and reply markers, so your message, the reply and the earlier turns share {512 - fewshot - 2}.") \
        in composer
    prompt = re.sub(r"\s+", " ", client.get(f"/chat/c/{cid}/m/{mid}/prompt").get_data(as_text=True))
    assert f"the start and reply markers 2, the built-in (few-shot) examples {fewshot}:" in prompt


@pytest.mark.parametrize("text, name", [(" ", "space"), ("\n", "newline"), ("\t", "tab"), ("   ", "3 spaces"),
                                        (" \n\n", "space, 2 newlines"), ("", "empty"), (" the", None), ("x", None)])
def test_a_token_of_whitespace_is_given_a_name_to_read_aloud(text, name):
    from webapp.chat.web.token_views import whitespace_name
    assert whitespace_name(text) == name


def test_a_branch_leaves_the_composer_with_the_browsers_own_settings_not_the_replys_seed(chat_app):
    """A rerun writes a reply with its own settings and seed; the composer kept that seed for every later
    message, across restarts (issue 51)."""
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="6", temperature="0.9")  # no seed: one is drawn
    with chat_app.app_context():
        from webapp.chat.web.conversations import service
        drawn = service().store.message(cid, mid).settings["seed"]
    assert drawn is not None
    csrf = csrf_of(client, f"/chat/c/{cid}")
    branched = client.post(f"/chat/c/{cid}/m/{mid}/branch", data={"csrf_token": csrf, "index": "2", "text": "ok"},
                           headers={"HX-Request": "true"})
    assert branched.status_code == 200
    for html in (branched.get_data(as_text=True), client.get(f"/chat/c/{cid}").get_data(as_text=True)):
        assert f"seed {drawn}" not in html and f'value="{drawn}"' not in html
        assert "temperature 0.9" in html  # the browser's own settings, kept
