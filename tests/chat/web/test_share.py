"""Read-only links (webapp/chat/web/share.py), issue 31 item 7: a shared conversation's Tokens (each token's
odds and alternatives) and Compare (two versions of a reply), read-only, for a browser without the owner's
cookie; nothing of them after unsharing, and no link that names the conversation's own id."""

from __future__ import annotations

import html
import re

import torch

from tests.chat.ablation.test_compute import SPECIALS, reference
from tests.chat.ablation.test_pages import chat_app, finish, prompt_of, state_of, store
from tests.chat.web.test_conversations import send, stream_url
from tests.conftest import csrf_of

__all__ = ["chat_app"]

STOPPED = "This shared conversation does not exist, or its owner stopped sharing it."


def shared_versions(app):
    """A sampled reply and a second version of it, branched at token 4 with another of the model's
    alternatives (the version shown), shared -> (owner's client, conversation id, the share link, the first
    version's id, the second's)."""
    owner = app.test_client()
    sent = send(owner, "Compare us", max_new_tokens="8", temperature="1.0", top_k="0", seed="11")
    url = stream_url(sent.get_data(as_text=True))
    cid, first = url.split("/")[3], int(re.search(r"/m/(\d+)/stream", url).group(1))
    finish(owner, cid, first)
    rows = store(app).details(first).odds
    other = next(t for t, _, _ in rows[3][5] if t != rows[3][0])
    csrf = csrf_of(owner, f"/chat/c/{cid}")
    branched = owner.post(f"/chat/c/{cid}/m/{first}/branch",
                          data={"csrf_token": csrf, "index": "3", "token": str(other)})
    assert branched.status_code == 303  # without JavaScript: once the whole new version is written
    second = store(app).messages(cid)[-1].id
    assert second != first and store(app).messages(cid)[-1].versions == (first, second)
    owner.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf})
    link = re.search(r"/chat/shared/[\w-]+", owner.get(f"/chat/c/{cid}").get_data(as_text=True)).group(0)
    return owner, cid, link, first, second


def main_of(page: str) -> str:
    return page.split("<main", 1)[1]


def read_only(page: str, link: str, cid: str) -> None:
    """No form (a write, or a GET to an owner's page) and every link through the share link: none names the
    conversation's own id."""
    main = main_of(page)
    assert "<form" not in main and "csrf_token" not in main and "hx-post" not in main
    assert cid not in page
    targets = re.findall(r'(?:href|hx-get|action)="([^"]*)"', main)
    assert targets and all(t.startswith((link + "/", link + "#", "?t=", "#")) for t in targets), targets


def test_the_shared_page_links_each_replys_tokens_and_compare_with_its_other_version(chat_app):
    owner, cid, link, first, second = shared_versions(chat_app)
    stranger = chat_app.test_client()  # another browser: none of the owner's cookies
    page = stranger.get(link).get_data(as_text=True)
    assert f'href="{link}/m/{second}/tokens">Tokens</a>' in page
    assert f'href="{link}/m/{second}/compare/{first}">Compare with version 1</a>' in page
    assert "version 2 of 2" in page and "branched at token 4" in page
    assert f"Model: <strong>{store(chat_app).messages(cid)[-1].model}</strong>" in page  # the model card
    assert f"{link}/m/{second}/prompt" in page and f"{link}/m/{second}/inside/0" in page
    read_only(page, link, cid)
    owner.post(f"/chat/c/{cid}/m/{first}/show", data={"csrf_token": csrf_of(owner, f"/chat/c/{cid}")})
    page = stranger.get(link).get_data(as_text=True)  # the first version shown: it compares with the second
    assert f'href="{link}/m/{first}/compare/{second}">Compare with version 2</a>' in page and "version 1 of 2" in page


def test_shared_tokens_show_the_stored_odds_which_are_the_models_read_only(chat_app):
    owner, cid, link, first, second = shared_versions(chat_app)
    stranger = chat_app.test_client()
    rows = store(chat_app).details(second).odds
    page = stranger.get(f"{link}/m/{second}/tokens").get_data(as_text=True)
    assert page.count('<a class="tok s') == len(rows) == 8
    labels = re.findall(r'aria-label="[^"]*: ([\d.]+%|typed)">', page)
    assert labels == [f"{row[1] * 100:.1f}%" for row in rows]  # the picked token at 4 has the model's own odds
    assert [int(s) for s in re.findall(r'<a class="tok s(\d)', page)] == [min(9, int(row[1] * 10)) for row in rows]
    assert page.count(f'hx-get="{link}/m/{second}/tokens/') == 8 and f'href="{link}/m/{second}/inside/0"' in page
    assert "Back to the shared conversation" in page
    read_only(page, link, cid)

    state, prompt = state_of(chat_app), prompt_of(chat_app, second)
    ids = [row[0] for row in rows]
    for index in (0, 5):  # one sampled before the branch, one after it
        chosen = stranger.get(f"{link}/m/{second}/tokens?t={index}").get_data(as_text=True)
        panel = stranger.get(f"{link}/m/{second}/tokens/{index}", headers={"HX-Request": "true"}).get_data(as_text=True)
        assert panel.lstrip().startswith("<section") and "<html" not in panel and panel.strip() in chosen
        meters = [float(v) for v in re.findall(r'<meter min="0" max="1" value="([^"]+)">', panel)]
        assert meters == [p for _, p, _ in rows[index][5]] and len(meters) == 10  # exactly the stored odds
        probs = reference(state, 2, prompt + ids[:index])[:SPECIALS].softmax(-1)  # nanoGPT by hand
        top = torch.topk(probs, 10)
        assert [t for t, _, _ in rows[index][5]] == top.indices.tolist()
        assert torch.allclose(torch.tensor(meters, dtype=torch.float64), top.values, rtol=1e-3, atol=0)
        assert f"probability {rows[index][1] * 100:.2f}%" in panel and f"rank {rows[index][3]}" in panel
        assert f'href="{link}/m/{second}/inside/{index}"' in panel
        assert f'href="{link}/m/{second}/attribution/{index}"' in panel
        assert 'name="token"' not in panel and "Patch from another question" not in panel
        assert "switched off" not in panel and "A branch keeps" not in panel
        read_only(chosen, link, cid)
        assert "<form" not in panel and cid not in panel
    # the owner's panel, for the same token, offers branching; the shared one the same odds without it
    own = owner.get(f"/chat/c/{cid}/m/{second}/tokens/5").get_data(as_text=True)
    assert 'name="token"' in own and re.findall(r'<meter[^>]*>', own) == re.findall(r'<meter[^>]*>', panel)
    assert stranger.get(f"{link}/m/{second}/tokens/8").status_code == 404
    assert stranger.get(f"{link}/m/{second}/tokens?t=99").status_code == 200  # no token 100: no panel, as the owner's


def test_shared_compare_shows_two_versions_of_the_shared_conversation_read_only(chat_app):
    owner, cid, link, first, second = shared_versions(chat_app)
    stranger = chat_app.test_client()
    page = stranger.get(f"{link}/m/{second}/compare/{first}").get_data(as_text=True)
    assert "They share their first 3 tokens and first differ at token 4." in page
    assert page.count('class="token-panel"') == 2 and 'id="token-panel-1"' in page and 'id="token-panel-2"' in page
    assert f'href="{link}/m/{second}/tokens"' in page and f'href="{link}/m/{first}/tokens"' in page
    assert f'href="{link}/m/{first}/inside/3"' in page  # the version not shown, inside, through the link too
    assert "Back to the shared conversation" in page
    read_only(page, link, cid)
    assert page == stranger.get(f"{link}/m/{second}/compare/{first}").get_data(as_text=True)
    own = owner.get(f"/chat/c/{cid}/m/{second}/compare/{first}").get_data(as_text=True)
    shades = r'<span class="tok s\d[^"]*"\s+title="[^"]*">'
    assert re.findall(shades, own) == re.findall(shades, page)  # the same tokens and odds as the owner's
    # the version not shown is of the shared conversation: its tokens and Inside open through the link
    rows = store(chat_app).details(first).odds
    other = stranger.get(f"{link}/m/{first}/tokens").get_data(as_text=True)
    assert re.findall(r'aria-label="[^"]*: ([\d.]+%)">', other) == [f"{row[1] * 100:.1f}%" for row in rows]
    assert stranger.get(f"{link}/m/{first}/compare/{second}").status_code == 200


def test_what_is_not_of_the_shared_conversation_and_everything_after_unsharing_is_404(chat_app):
    owner, cid, link, first, second = shared_versions(chat_app)
    stranger = chat_app.test_client()
    sent = send(owner, "Another conversation", max_new_tokens="3", temperature="0")  # the owner's other one
    url = stream_url(sent.get_data(as_text=True))
    elsewhere = int(re.search(r"/m/(\d+)/stream", url).group(1))
    finish(owner, url.split("/")[3], elsewhere)
    question = store(chat_app).messages(cid)[0].id
    for path in (f"/m/{elsewhere}/tokens", f"/m/{elsewhere}/tokens/0", f"/m/{second}/compare/{elsewhere}",
                 f"/m/{elsewhere}/compare/{second}", f"/m/{elsewhere}/inside/0", f"/m/{elsewhere}/prompt"):
        answer = stranger.get(link + path)
        assert answer.status_code == 404, path
        assert "No such message in this shared conversation." in html.unescape(answer.get_data(as_text=True)), path
    assert stranger.get(f"{link}/m/{question}/tokens").status_code == 404  # a question has no tokens
    assert stranger.get(f"{link}/m/{second}/compare/{question}").status_code == 404

    paths = ("", f"/m/{second}/tokens", f"/m/{second}/tokens?t=2", f"/m/{second}/tokens/2",
             f"/m/{second}/compare/{first}", f"/m/{first}/tokens", f"/m/{second}/prompt")
    assert all(stranger.get(link + p).status_code == 200 for p in paths)
    owner.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf_of(owner, f"/chat/c/{cid}")})
    for path in paths:
        answer = stranger.get(link + path)
        assert answer.status_code == 404, path
        assert STOPPED in html.unescape(answer.get_data(as_text=True)), path


def test_every_shared_route_only_reads(chat_app):
    """No write endpoint behind a share link: each of its routes answers GET (and HEAD) only."""
    rules = [r for r in chat_app.url_map.iter_rules() if r.rule.startswith("/chat/shared/")]
    assert {r.endpoint for r in rules} >= {"chat.shared", "chat.shared_tokens", "chat.shared_token_panel",
                                           "chat.shared_compare", "chat.shared_prompt", "chat.shared_inside"}
    assert all(r.methods <= {"GET", "HEAD", "OPTIONS"} for r in rules), [(r.rule, r.methods) for r in rules]
    owner, cid, link, first, second = shared_versions(chat_app)
    stranger = chat_app.test_client()
    for path in (f"/m/{second}/tokens", f"/m/{second}/compare/{first}", f"/m/{second}/branch"):
        assert stranger.post(link + path).status_code in (400, 403, 404, 405), path
