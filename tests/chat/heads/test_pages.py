"""One head over a reply (query × key) through the app: the weights equal nanoGPT's math on the test model,
the regions are where the Prompt page splits the prompt, each row of the page's matrix (few-shot summed)
sums to 1, the page shows the real tokens and needs no JavaScript, rows are capped, a branch's tokens are
its own, 400 and 404 for bad heads, share links read-only."""

from __future__ import annotations

import html as html_lib
import re

import pytest
import torch

from tests.chat.heads.test_compute import reference
from tests.chat.web import test_glass
from tests.chat.web.test_glass import reply
from tests.conftest import csrf_of
from webapp.chat.heads.jobs import HeadReport, HeadRequest
from webapp.chat.heads.service import MAX_ROWS, Region, regions
from webapp.chat.heads.view import matrix
from webapp.web.state import glassbox

chat_app = test_glass.chat_app  # the tiny test model, made to never stop before max_new_tokens


def details_of(app, message_id):
    from webapp.chat.web.blueprint import service
    with app.app_context():
        return service().details(message_id)


def prompt_page_split(client, cid, mid) -> list[tuple[str, int]]:
    """The Prompt page's parts in order, as (kind, tokens shown), read from its HTML."""
    page = client.get(f"/chat/c/{cid}/m/{mid}/prompt").get_data(as_text=True)
    parts = re.findall(r'<li class="part (\w+)">(.*?)</li>', page, re.S)
    return [(kind, body.count('<span class="tok"')) for kind, body in parts]


def test_the_json_weights_are_nanogpts_and_the_regions_are_the_prompt_pages(chat_app):
    client = chat_app.test_client()
    cid, _, _ = reply(client, "Hello there", max_new_tokens="4", temperature="0")
    cid, mid, _ = reply(client, "And again?", max_new_tokens="6", temperature="0", conversation_id=cid)
    details = details_of(chat_app, mid)
    prompt, reply_ids = details.prompt["ids"], [row[0] for row in details.odds]
    model = glassbox(chat_app).core.models["chat"].model
    index = 5
    data = client.get(f"/chat/c/{cid}/m/{mid}/inside/{index}/head/1.1.json").get_json()
    context = prompt + reply_ids[:index]
    inside = client.get(f"/chat/c/{cid}/m/{mid}/inside/{index}.json").get_json()
    assert data["context_ids"] == context == inside["context_ids"]
    assert data["head"] == {"layer": 1, "head": 1} and data["token"] == {"index": index}
    assert data["queries"] == list(range(len(prompt) - 1, len(context)))  # the reply's start marker .. p
    want = reference(model, context)[1][1, len(prompt) - 1:]
    torch.testing.assert_close(torch.tensor(data["weights"]), want, atol=1e-5, rtol=1e-4)
    assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in data["weights"])
    # one numbering everywhere: head L.H is row [L][H] of Inside's answer, as ablation and attribution count
    assert data["weights"][-1] == pytest.approx(inside["attention"]["weights"][1][1], abs=1e-6)

    split, at = prompt_page_split(client, cid, mid), 0  # the Prompt page, part by part
    edges = []
    for kind, tokens in split:
        edges.append((kind, at, at + tokens))
        at += tokens
    assert at == len(prompt)
    fewshot = [e for e in edges if e[0] == "fewshot"]
    turns = [e for e in edges if e[0] == "turn"]
    assert len(turns) == 3  # the first question, its reply, the question this reply answers
    assert [(r["kind"], r["start"], r["end"]) for r in data["regions"]] == [
        ("start", 0, 1), ("fewshot", fewshot[0][1], fewshot[-1][2]), ("earlier", turns[0][1], turns[1][2]),
        ("user", turns[2][1], turns[2][2]), ("reply", len(prompt) - 1, len(context))]
    assert data["regions"][2]["label"] == "earlier turns" and data["max_rows"] == MAX_ROWS


def test_the_page_labels_real_tokens_marks_regions_and_each_row_sums_to_one_with_few_shot_summed(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Why so?", max_new_tokens="5", temperature="0")
    inside = client.get(f"/chat/c/{cid}/m/{mid}/inside/3?head=0.0").get_data(as_text=True)
    url = f"/chat/c/{cid}/m/{mid}/inside/3/head/0.0"
    assert f'href="{url}#matrix"' in inside  # linked from the chosen head's detail
    page = client.get(url).get_data(as_text=True)  # no HX-Request: the request waits for the job
    details = details_of(chat_app, mid)
    prompt = details.prompt["ids"]
    fewshot = sum(1 for p in details.prompt["parts"] for _ in range(p["tokens"]) if p["kind"] == "fewshot")
    assert "Layer 0, head 0" in page and f"few-shot examples ({fewshot} tokens, summed)" in page
    heads = re.findall(r'<th scope="col" class="(\w+)[^"]*"[^>]*>(.*?)</th>', page, re.S)
    texts = [html_lib.unescape(re.sub(r"<small>.*?</small>|<[^>]+>", "", body)) for _, body in heads]
    assert [k for k, _ in heads] == ["start", "fewshot"] + ["user"] * 9 + ["reply"] * 4
    assert texts[0] == "<|bos|>" and texts[2] == "<|user_start|>" and "".join(texts[3:10]) == "Why so?"
    assert "<small>space</small>" in heads[6][1]  # whitespace is named
    assert texts[10] == "<|user_end|>" and texts[11] == "<|assistant_start|>"
    for label in ("start", "few-shot examples", "the user&#39;s message", "the reply"):
        assert re.search(rf'<th scope="(col|row)group"[^>]*>{label}</th>', page)
    rows = re.findall(r'<th scope="row">(.*?)</th>(.*?)</tr>', page, re.S)
    assert len(rows) == 4 and "→ token 4" in rows[-1][0]  # the reply's start marker and tokens 1..3
    assert all(cells.count("<td") == len(heads) for _, cells in rows)
    assert all(cells.count('class="after') == 3 - n for n, (_, cells) in enumerate(rows))
    assert 'class="table-scroll qk-scroll" id="matrix" tabindex="0" role="region"' in page
    assert "style=" not in page.split("<main", 1)[1]

    data = client.get(f"{url}.json").get_json()
    kept = HeadReport(HeadRequest(tuple(data["context_ids"]), 3, 0, 0, data["queries"][0]), data["weights"])
    shown = matrix(glassbox(chat_app).core.models["chat"].tokenizer, kept,
                   regions(details.prompt, 3, len(prompt) + 3))
    assert [c.summed for c in shown.columns].count(True) == 1
    for row in shown.rows:
        assert sum(c.weight for c in row.cells) == pytest.approx(1.0, abs=1e-5)

    every = client.get(f"{url}?keys=all").get_data(as_text=True)
    assert every.count('<th scope="col"') == len(prompt) + 3 and "summed)" not in every
    assert f'href="{url}#matrix"' in every  # and back


def test_a_prompt_whose_parts_cannot_be_read_is_one_region():
    assert regions({"ids": [0] * 10, "parts": []}, 3, 13) == [Region("prompt", 0, 10), Region("reply", 10, 13)]
    assert regions({"ids": [0] * 10, "parts": [{"kind": "bos"}]}, 0, 10) == [Region("prompt", 0, 10)]


def test_rows_may_start_at_the_users_message(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Why so?", max_new_tokens="5", temperature="0")
    details = details_of(chat_app, mid)
    prompt = details.prompt["ids"]
    user = next(p for p in details.prompt["parts"] if p["kind"] == "turn")
    url = f"/chat/c/{cid}/m/{mid}/inside/4/head/1.0"
    data = client.get(f"{url}.json?rows=user").get_json()
    context = prompt + [row[0] for row in details.odds[:4]]
    assert data["queries"] == list(range(user["start"], len(context)))
    model = glassbox(chat_app).core.models["chat"].model
    want = reference(model, context)[1][0, user["start"]:]
    torch.testing.assert_close(torch.tensor(data["weights"]), want, atol=1e-5, rtol=1e-4)
    page = client.get(url).get_data(as_text=True)
    assert f'href="{url}?rows=user#matrix">the user\'s message</a>' in page
    rows = client.get(f"{url}?rows=user").get_data(as_text=True)
    assert re.search(r'<th scope="rowgroup" rowspan="9" class="qk-region user">the user&#39;s message</th>', rows)
    assert re.search(r'<th scope="rowgroup" rowspan="5" class="qk-region reply">the reply</th>', rows)
    assert rows.count('<th scope="row">') == 14 and f'href="{url}?keys=all&amp;rows=user#matrix"' in rows
    bad = client.get(f"{url}.json?rows=everything")
    assert bad.status_code == 400 and "rows must be one of reply, user" in bad.get_json()["error"]


def test_a_long_reply_shows_its_last_rows_only(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Go on", max_new_tokens=str(MAX_ROWS + 6), temperature="0")
    data = client.get(f"/chat/c/{cid}/m/{mid}/inside/{MAX_ROWS + 5}/head/0.1.json").get_json()
    p = len(data["context_ids"]) - 1
    assert data["queries"] == list(range(p - MAX_ROWS + 1, p + 1)) and len(data["weights"]) == MAX_ROWS
    page = client.get(f"/chat/c/{cid}/m/{mid}/inside/{MAX_ROWS + 5}/head/0.1").get_data(as_text=True)
    assert f"the last {MAX_ROWS} of them" in page and page.count('<th scope="row">') == MAX_ROWS


def test_the_window_cut_moves_the_regions_with_the_context():
    prompt = {"ids": list(range(20)), "block_size": 26, "max_new_tokens": 6, "fewshot_tokens": 7, "budget": 11,
              "parts": [
        {"kind": "bos", "role": None, "text": None, "start": 0, "end": 1, "tokens": 1},
        {"kind": "fewshot", "role": "user", "text": "q", "start": 1, "end": 8, "tokens": 7},
        {"kind": "dropped", "role": "user", "text": "old", "start": 8, "end": 8, "tokens": 30},
        {"kind": "turn", "role": "user", "text": "hi", "start": 8, "end": 19, "tokens": 11},
        {"kind": "reply_start", "role": None, "text": None, "start": 19, "end": 20, "tokens": 1}]}
    assert regions(prompt, 6, 26) == [Region("start", 0, 1), Region("fewshot", 1, 8), Region("user", 8, 19),
                                      Region("reply", 19, 26)]
    # a context of 16 ids: the window kept the last 16 of 26, so the bos and few-shot fell out
    assert regions(prompt, 6, 16) == [Region("user", 0, 9), Region("reply", 9, 16)]


def test_a_branch_is_read_with_its_own_tokens(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="8", temperature="0")
    csrf = csrf_of(client, f"/chat/c/{cid}")
    assert client.post(f"/chat/c/{cid}/m/{mid}/branch",
                       data={"csrf_token": csrf, "index": "2", "text": "ok!"}).status_code == 303
    from webapp.chat.web.blueprint import service
    with chat_app.app_context():
        branch = service().store.messages(cid)[-1].id
    data = client.get(f"/chat/c/{cid}/m/{branch}/inside/6/head/0.0.json").get_json()
    assert data["context_ids"][-4:-1] == list(b"ok!")
    assert data["context_ids"] == client.get(f"/chat/c/{cid}/m/{branch}/inside/6.json").get_json()["context_ids"]


def test_bad_heads_get_400_or_404_with_a_message_and_share_links_are_read_only(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(mine, "private", max_new_tokens="3", temperature="0")
    base = f"/chat/c/{cid}/m/{mid}/inside"
    malformed = mine.get(f"{base}/0/head/two.json")
    assert malformed.status_code == 400 and "layer.head" in malformed.get_json()["error"]
    missing = mine.get(f"{base}/0/head/2.0.json")
    assert missing.status_code == 404 and "blocks 0 to 1 and heads 0 to 1" in missing.get_json()["error"]
    assert mine.get(f"{base}/0/head/0.2").status_code == 404 and mine.get(f"{base}/0/head/1-2").status_code == 400
    assert "layer.head" in mine.get(f"{base}/0/head/x.y").get_data(as_text=True)
    assert mine.get(f"{base}/3/head/0.0.json").status_code == 404  # no token 3
    assert theirs.get(f"{base}/0/head/0.0").status_code == 404  # another browser's conversation
    mine.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    token = re.search(r"/chat/shared/([\w-]+)", mine.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    shared = f"/chat/shared/{token}/m/{mid}/inside/1/head/1.1"
    assert shared in theirs.get(f"/chat/shared/{token}/m/{mid}/inside/1?head=1.1").get_data(as_text=True)
    page = theirs.get(shared).get_data(as_text=True)
    assert "Layer 1, head 1" in page and "<form" not in page.split("<main", 1)[1].replace('class="theme-form"', "")
    assert theirs.get(f"{shared}.json").get_json() == mine.get(f"{base}/1/head/1.1.json").get_json()
    mine.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    assert theirs.get(f"{shared}.json").status_code == 404
