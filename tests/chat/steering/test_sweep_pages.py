"""Sweep α through the app: the form under a reply writes a version per strength and lands on a page that shows
them beside the original, by strength, each the loop's steered greedy reply, with where it first differs; the page
polls while a version is being written and stops when all have ended; bad input is a 4xx naming what is wrong."""

from __future__ import annotations

import html
import re

import torch

from tests.chat.ablation.test_pages import CONFIG, finish, greedy_reply, prompt_of, store, tokens_of
from tests.chat.steering import test_pages as test_steering
from tests.chat.steering.test_pages import direction, gpt, steered_greedy
from tests.conftest import csrf_of

chat_app = test_steering.chat_app  # the fixture: a model whose heads matter, never sampling a special


def swept(client, cid: str, mid: int, alphas: str, name: str = "sweep"):
    csrf = csrf_of(client, f"/chat/c/{cid}")
    return client.post(f"/chat/c/{cid}/m/{mid}/steer_sweep", data={"csrf_token": csrf, "direction": name,
                                                                   "alphas": alphas})


def columns(page: str) -> list[tuple[str, str, int]]:
    """(heading, status line, how many tokens it shows) of each column, in the page's order."""
    found = []
    for side in re.findall(r'<section class="side".*?</section>', page, re.S):
        heading = re.sub(r"\s+", " ", re.sub(r"<small>.*?</small>", "", re.search(r"<h2>(.*?)</h2>", side, re.S)
                                              .group(1), flags=re.S)).strip()
        status = re.sub(r"\s+", " ", re.search(r'class="sweep-status"[^>]*>(.*?)</p>', side, re.S).group(1)).strip()
        found.append((heading, status, len(re.findall(r'<span class="tok[ "]', side))))
    return found


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_the_sweep_form_lands_on_a_page_with_each_strength_beside_the_original(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=6)
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(5)) * 4
    assert direction(client, name="sweep", layer=1, vector=vector.tolist()).status_code == 201
    sent = swept(client, cid, mid, "8, \u22128  0")  # in any order, a typographic minus too
    assert sent.status_code == 303, sent.get_data(as_text=True)
    ids = [int(v) for v in re.search(r"v=([\d%C,]+)", sent.headers["Location"]).group(1).replace("%2C", ",")
           .split(",")]
    assert len(ids) == 3
    for new in ids:
        finish(client, cid, new)
    prompt, plain = prompt_of(chat_app, mid), tokens_of(chat_app, mid)
    for new, alpha in zip(ids, (8, -8, 0)):  # each version is the loop's steered greedy reply
        assert tokens_of(chat_app, new) == steered_greedy(gpt(chat_app), prompt, 6, 1, alpha * vector)

    page = client.get(sent.headers["Location"]).get_data(as_text=True)
    assert "Sweep α: sweep after block 1" in page and "hx-get" not in page and "refresh" not in page
    got = columns(page)
    assert [heading for heading, _, _ in got] == ["Original", "α = -8", "α = 0", "α = 8"]  # by strength
    assert got[2][1] == "The same as the original, token for token."
    for (heading, status, shown), new in zip(got[1:], (ids[1], ids[2], ids[0])):
        first = first_difference(plain, tokens_of(chat_app, new))
        if first is not None:
            assert status == f"Differs from token {first + 1} on.", (heading, status)
        assert shown == len(tokens_of(chat_app, new)) == 6
    assert any(status.startswith("Differs") for _, status, _ in got), "the strengths changed no reply"
    assert f'/chat/c/{cid}/m/{ids[0]}/compare/{mid}"' in page


def a_sweep_still_being_written(app, client) -> tuple[str, int, list[int], str]:
    """A sweep of two strengths whose second version reads as still being written -> (conversation, reply,
    versions, the sweep's page)."""
    cid, mid = greedy_reply(client, n=4)
    assert direction(client, name="sweep", layer=0, vector=[1.0] * CONFIG.n_embd).status_code == 201
    sent = swept(client, cid, mid, "-2 2")
    ids = [int(v) for v in sent.headers["Location"].split("v=")[1].replace("%2C", ",").split(",")]
    for new in ids:
        finish(client, cid, new)
    with store(app).db.transaction() as db:  # as a version still being written reads
        db.execute("UPDATE messages SET status = 'pending', content = 'Half a' WHERE id = ?", (ids[1],))
    return cid, mid, ids, sent.headers["Location"]


def test_the_page_polls_while_a_version_is_being_written_and_stops_when_all_have_ended(chat_app):
    client = chat_app.test_client()
    cid, mid, ids, url = a_sweep_still_being_written(chat_app, client)
    live = client.get(url).get_data(as_text=True)
    assert 'hx-trigger="load delay:1s"' in live and '<meta http-equiv="refresh"' in live  # JavaScript or not
    assert columns(live)[2][1] == "Writing… 6 characters so far." and "Half a" in live
    fragment = client.get(url, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.lstrip().startswith('<div id="sweep"') and "<html" not in fragment
    with store(chat_app).db.transaction() as db:
        db.execute("UPDATE messages SET status = 'complete' WHERE id = ?", (ids[1],))
    ended = client.get(url, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "hx-get" not in ended and "Writing" not in ended


def test_bad_sweeps_are_a_4xx_naming_what_is_wrong_and_start_nothing(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=3)
    assert direction(client, name="sweep", layer=1, vector=[0.5] * CONFIG.n_embd).status_code == 201
    before = len(store(chat_app).all_messages(cid))
    for alphas, status, words in [("4, four", 400, "'four' is not one"), ("4", 400, "2 to 9 strengths"),
                                  (" ".join(["1"] * 10), 400, "2 to 9 strengths"),
                                  ("1 2000", 400, "from -1000 to 1000"), ("", 400, "2 to 9 strengths")]:
        got = swept(client, cid, mid, alphas)
        assert got.status_code == status and words in html.unescape(got.get_data(as_text=True)), alphas
    assert swept(client, cid, mid, "1 2", name="nope").status_code == 404
    assert len(store(chat_app).all_messages(cid)) == before  # nothing started
    # the page shows only steered versions of this reply
    ablated = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": ["0.0"]})
    assert ablated.status_code == 200, ablated.get_json()
    for v, status in [("abc", 400), ("", 400), (str(mid), 404), (str(ablated.get_json()["message_id"]), 404),
                      ("999999", 404)]:
        assert client.get(f"/chat/c/{cid}/m/{mid}/sweep?v={v}").status_code == status, v
    other = chat_app.test_client()  # another browser sees none of it
    assert other.get(f"/chat/c/{cid}/m/{mid}/sweep?v={mid}").status_code == 404


def test_the_presenters_sweep_fills_in_on_the_followers_screens_read_only(chat_app):
    """Issue 51: the sweep the presenter opens is the followers' view, polling while a version is written, with
    links that stay inside the follow link; its polls (htmx fragments) say nothing new to the room."""
    from tests.chat.web.test_present import present
    from tests.chat.web.test_presenter_view import state_of
    client, follower = chat_app.test_client(), chat_app.test_client()
    cid, mid, ids, _ = a_sweep_still_being_written(chat_app, client)
    link = present(client, cid)
    token = link.rsplit("/", 1)[1]
    listed = ",".join(map(str, ids))
    assert client.get(f"/chat/c/{cid}/m/{mid}/sweep", query_string={"v": listed}).status_code == 200
    state = state_of(chat_app, link)
    assert state["label"] == "a sweep of strengths" and state["path"] == "sweep?v=" + listed.replace(",", "%2C")
    version = state["path"]
    client.get(f"/chat/c/{cid}/m/{mid}/sweep", query_string={"v": str(ids[0])}, headers={"HX-Request": "true"})
    assert state_of(chat_app, link)["path"] == version  # a poll is no new view
    twin = follower.get(f"/chat/shared/{token}/m/{mid}/{version}").get_data(as_text=True)
    assert [heading for heading, _, _ in columns(twin)] == ["Original", "α = -2", "α = 2"]
    assert f'hx-get="/chat/shared/{token}/m/{mid}/sweep?v=' in twin and "Half a" in twin  # polls its own twin
    assert f"/chat/c/{cid}" not in twin  # no link names the conversation's own address
    assert f"/chat/shared/{token}/m/{ids[0]}/compare/{mid}" in twin
