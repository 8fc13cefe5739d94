"""The logit lens over a whole reply through the app: every cell against nanoGPT's math written out here
(the residual after each block, the final layer norm, the output layer, a softmax), the last row against the
reply's own saved odds (an ablated version's too), a column per reply token linking to Inside, typed tokens
named, the page without JavaScript, share links read-only and gone after unsharing, clear errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.nn import functional as F

from tests.chat.ablation import test_pages as test_ablation
from tests.chat.ablation.test_pages import finish, greedy_reply, prompt_of, state_of, tokens_of
from tests.chat.web.test_conversations import send, stream_url
from tests.conftest import csrf_of, sse_events
from webapp.web.state import glassbox

chat_app = test_ablation.chat_app  # a model whose heads matter, never sampling a special
SPECIALS = 256  # the byte tokenizer's specials start here; the fixture's output layer masks them


def reference_lens(state: dict, n_head: int, ids: list[int], zeroed: set[tuple[int, int]] = frozenset(),
                   mlps_zeroed: set[int] = frozenset()) -> torch.Tensor:
    """nanoGPT's forward over ids in float64, written out: the probabilities (softmax at temperature 1 over
    the output layer, specials masked as the fixture's model does) read from the residual stream at every
    position after the embeddings and after each block -> (n_layer + 1, T, V). zeroed: heads (layer, head)
    whose output is replaced by zeros at every position; mlps_zeroed: MLPs likewise."""
    w = {k: v.double() for k, v in state.items()}
    T = len(ids)
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]  # (T, C)
    C = x.size(1)
    hs = C // n_head
    n_layer = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("transformer.h."))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    residuals = [x]
    for layer in range(n_layer):
        p = f"transformer.h.{layer}."
        a = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        q, k, v = (a @ w[p + "attn.c_attn.weight"].T + w[p + "attn.c_attn.bias"]).split(C, dim=1)
        q, k, v = (t.view(T, n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = (q @ k.transpose(1, 2)) / math.sqrt(hs)
        y = att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v  # (nh, T, hs)
        for at, head in zeroed:
            if at == layer:
                y[head] = 0.0
        x = x + y.transpose(0, 1).reshape(T, C) @ w[p + "attn.c_proj.weight"].T + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        m = F.gelu(m @ w[p + "mlp.c_fc.weight"].T + w[p + "mlp.c_fc.bias"])
        m = m @ w[p + "mlp.c_proj.weight"].T + w[p + "mlp.c_proj.bias"]
        x = x + (0.0 * m if layer in mlps_zeroed else m)
        residuals.append(x)
    out = F.layer_norm(torch.stack(residuals), (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
    logits = out @ w["transformer.wte.weight"].T  # (L, T, V)
    logits[..., SPECIALS:] = float("-inf")
    return logits.softmax(dim=-1)


def assert_cells_are_the_references(data: dict, probs: torch.Tensor, first: int, reply: list[int]) -> None:
    """Every cell of the JSON against the reference's probabilities at positions first.. (one per column)."""
    for layer, row in enumerate(data["rows"]):
        assert row["layer"] == layer and row["label"] == ("embeddings" if layer == 0 else f"after block {layer - 1}")
        for column, (top, written) in enumerate(zip(row["top"], row["written"])):
            p = probs[layer, first + column]  # (V,)
            assert top["id"] == int(p.argmax()) and top["p"] == pytest.approx(float(p.max()), rel=1e-4)
            mine = p[reply[column]]
            assert written["p"] == pytest.approx(float(mine), rel=1e-4, abs=1e-9)
            assert written["rank"] == int((p > mine).sum()) + 1


def test_every_cell_is_nanogpts_math_and_the_last_row_is_the_replys_own_odds(chat_app):
    client = chat_app.test_client()
    sent = send(client, "Hello there", max_new_tokens="10", temperature="0.9", top_k="0", seed="4")
    url = stream_url(sent.get_data(as_text=True))
    assert sse_events(client.get(url).get_data(as_text=True))[-1][0] == "done"
    cid, mid = url.split("/")[3], int(re.search(r"/m/(\d+)/stream", url).group(1))
    answer = client.get(f"/chat/c/{cid}/m/{mid}/lens.json")
    assert answer.status_code == 200, answer.get_data(as_text=True)[:300]
    data = answer.get_json()
    from webapp.chat.web.blueprint import service
    with chat_app.app_context():
        odds = service().details(mid).odds
    prompt, reply = prompt_of(chat_app, mid), tokens_of(chat_app, mid)
    config = glassbox(chat_app).core.models["chat"].model.config
    assert (data["reply_tokens"], data["shown"], data["prompt_tokens"]) == (len(odds), len(odds), len(prompt))
    assert data["intervention"] is None and len(data["rows"]) == config.n_layer + 1
    assert [c["id"] for c in data["columns"]] == reply  # a column per reply token
    assert [c["position"] for c in data["columns"]] == list(range(len(prompt) - 1, len(prompt) - 1 + len(reply)))
    assert all(c["origin"] == "sampled" for c in data["columns"])
    assert all(len(row["top"]) == len(row["written"]) == len(reply) for row in data["rows"])
    probs = reference_lens(state_of(chat_app), config.n_head, prompt + reply)
    assert_cells_are_the_references(data, probs, len(prompt) - 1, reply)
    last = data["rows"][-1]["written"]  # the token panel's odds, saved with four significant digits
    assert [w["p"] for w in last] == pytest.approx([row[1] for row in odds], rel=1e-3)
    assert [w["rank"] for w in last] == [row[3] for row in odds]
    assert [c["odds"] for c in data["columns"]] == [{"p": row[1], "rank": row[3]} for row in odds]
    # the finished reply's KV cache was kept: the prompt's keys and values came from it, as Inside's do
    from webapp.chat.lens.service import LensService
    service_ = glassbox(chat_app).service(LensService)
    (report,) = [service_.report("glassbox", request) for (_, request) in list(service_.kept._kept)]
    assert report is not None and report.reused_positions == len(prompt) - 1
    service_.kept.clear()
    glassbox(chat_app).core.models["chat"].prefix_cache.clear()  # cold: the whole context runs
    cold = client.get(f"/chat/c/{cid}/m/{mid}/lens.json").get_json()
    assert_cells_are_the_references(cold, probs, len(prompt) - 1, reply)


def test_an_ablated_version_is_read_with_the_same_parts_off_and_its_last_row_is_its_own_odds(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "What is a head?", 8)
    answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": ["1.0"], "mlps": [0]})
    new = answer.get_json()["message_id"]
    finish(client, cid, new)
    data = client.get(f"/chat/c/{cid}/m/{new}/lens.json").get_json()
    assert data["intervention"] == {"heads": ["1.0"], "mlps": [0], "mode": "zero"}
    prompt, reply = prompt_of(chat_app, new), tokens_of(chat_app, new)
    state, n_head = state_of(chat_app), glassbox(chat_app).core.models["chat"].model.config.n_head
    probs = reference_lens(state, n_head, prompt + reply, zeroed={(1, 0)}, mlps_zeroed={0})
    assert_cells_are_the_references(data, probs, len(prompt) - 1, reply)
    from webapp.chat.web.blueprint import service
    with chat_app.app_context():
        odds = service().details(new).odds
    assert [w["p"] for w in data["rows"][-1]["written"]] == pytest.approx([row[1] for row in odds], rel=1e-3)
    plain = reference_lens(state, n_head, prompt + reply)  # the parts matter: unedited, the numbers differ
    assert not torch.allclose(plain[-1, len(prompt) - 1:], probs[-1, len(prompt) - 1:], rtol=1e-3)
    page = client.get(f"/chat/c/{cid}/m/{new}/lens").get_data(as_text=True)
    assert "read with the same parts switched off" in page and "head 1.0 and MLP 0 zeroed" in page


def test_the_page_without_javascript_a_column_per_token_each_linking_to_inside(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "Hello there", 6)
    base = f"/chat/c/{cid}/m/{mid}"
    for where in (f"/chat/c/{cid}", f"{base}/tokens", f"{base}/inside/0"):  # linked from the reply, Tokens, Inside
        assert f'href="{base}/lens"' in client.get(where).get_data(as_text=True), where
    page = client.get(f"{base}/lens").get_data(as_text=True)
    data = client.get(f"{base}/lens.json").get_json()
    grid = page[page.index('<table class="lens lens-grid"'):page.index("</table>")]
    head = grid[grid.index("<thead>"):grid.index("</thead>")]
    assert re.findall(r'<a href="([^"]+)"><span class="n">(\d+)</span>', head) == [
        (f"{base}/inside/{i}", str(i + 1)) for i in range(6)]
    body = grid[grid.index("<tbody>"):grid.index("</tbody>")]
    assert body.count('<th scope="row">') == len(data["rows"]) and "embeddings" in body
    cells = re.findall(r'<td class="cell s(\d)( chosen)?"', body)
    assert len(cells) == len(data["rows"]) * 6
    expected = [(str(min(9, int(top["p"] * 10))), " chosen" if top["id"] == column["id"] else "")
                for row in data["rows"] for top, column in zip(row["top"], data["columns"])]
    assert cells == expected  # shaded by the cell's token's probability; outlined where it is the written one
    assert sum(1 for _, chosen in cells[-6:] if chosen) == 6  # greedy: the last layer's top is every written token
    assert 'class="table-scroll" tabindex="0" role="region"' in page and 'class="legend"' in page
    by_written = client.get(f"{base}/lens?shade=written").get_data(as_text=True)
    shades = re.findall(r'<td class="cell s(\d)', by_written)
    assert shades == [str(min(9, int(w["p"] * 10))) for row in data["rows"] for w in row["written"]]
    assert "the written token's probability" in by_written and f'href="{base}/lens"' in by_written
    assert client.get(f"{base}/lens?shade=nonsense").status_code == 400


def test_typed_and_picked_tokens_are_named_as_such(chat_app):
    from webapp.chat.web.blueprint import service
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "Hello there", 6)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    assert client.post(f"/chat/c/{cid}/m/{mid}/branch",
                       data={"csrf_token": csrf, "index": "2", "text": "ok"}).status_code == 303
    with chat_app.app_context():
        typed_id = service().store.messages(cid)[-1].id
    finish(client, cid, typed_id)
    data = client.get(f"/chat/c/{cid}/m/{typed_id}/lens.json").get_json()
    assert [c["origin"] for c in data["columns"][:4]] == ["kept", "kept", "typed", "typed"]
    assert data["columns"][2]["odds"] == {"p": None, "rank": None}
    assert all(w["p"] > 0 for w in data["rows"][-1]["written"])  # the model's own odds, typed tokens too
    page = client.get(f"/chat/c/{cid}/m/{typed_id}/lens").get_data(as_text=True)
    assert page.count('<small class="origin">typed</small>') == 2 and "branched at token 3" in page


def test_bad_ids_other_browsers_and_share_links(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid = greedy_reply(mine, "private", 3)
    base = f"/chat/c/{cid}/m/{mid}/lens"
    for path in (base, f"{base}.json"):
        assert mine.get(path).status_code == 200
        assert theirs.get(path).status_code == 404
    assert "No such conversation" in theirs.get(f"{base}.json").get_json()["error"]
    question = mine.get(f"/chat/c/{cid}/m/{mid - 1}/lens.json")
    assert question.status_code == 404 and "Only replies" in question.get_json()["error"]
    assert mine.get(f"/chat/c/{cid}/m/99999/lens.json").status_code == 404
    assert mine.get(f"/chat/c/nope/m/{mid}/lens").status_code == 404
    mine.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    token = re.search(r"/chat/shared/([\w-]+)", mine.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    assert f"/chat/shared/{token}/m/{mid}/lens" in theirs.get(f"/chat/shared/{token}").get_data(as_text=True)
    page = theirs.get(f"/chat/shared/{token}/m/{mid}/lens").get_data(as_text=True)
    assert "through the logit lens" in page and f'href="/chat/shared/{token}/m/{mid}/inside/0"' in page
    assert f"/chat/c/{cid}" not in page  # read-only: no link into the owner's conversation
    assert theirs.get(f"/chat/shared/{token}/m/{mid}/lens.json").get_json() == mine.get(f"{base}.json").get_json()
    assert theirs.get(f"/chat/shared/{token}/m/{mid - 1}/lens.json").status_code == 404
    mine.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    assert theirs.get(f"/chat/shared/{token}/m/{mid}/lens.json").status_code == 404
    assert theirs.get(f"/chat/shared/{token}/m/{mid}/lens").status_code == 404


def test_a_remote_backend_answers_409_with_the_reason(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "Hello", 2)
    glassbox(chat_app).core.models["chat"].remote = True
    answer = client.get(f"/chat/c/{cid}/m/{mid}/lens.json")
    assert answer.status_code == 409 and "remote server" in answer.get_json()["error"]
    page = client.get(f"/chat/c/{cid}/m/{mid}/lens")
    assert page.status_code == 409 and "remote server" in page.get_data(as_text=True)


def test_a_long_reply_shows_its_first_columns_and_says_so(chat_app, monkeypatch):
    from webapp.chat.lens import service as lens
    monkeypatch.setattr(lens, "MAX_COLUMNS", 4)
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "Hello there", 7)
    data = client.get(f"/chat/c/{cid}/m/{mid}/lens.json").get_json()
    assert (data["reply_tokens"], data["shown"], len(data["columns"])) == (7, 4, 4)
    assert all(len(row["top"]) == 4 for row in data["rows"])
    page = client.get(f"/chat/c/{cid}/m/{mid}/lens").get_data(as_text=True)
    assert "Showing the first 4 of 7 tokens" in page


def test_a_reply_still_being_written_and_a_damaged_record_of_what_was_switched_off_answer_409(tmp_path, chat_app):
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    slow = make_app(tmp_path / "slow", {"chat": tiny_chat_model(tmp_path / "slow" / "chat", seconds_per_step=0.05)})
    try:
        client = slow.test_client()
        sent = send(client, "Hello", max_new_tokens="200")
        mid = int(re.search(r"/m/(\d+)/stream", stream_url(sent.get_data(as_text=True))).group(1))
        cid = re.search(r'name="conversation_id" value="([0-9a-f]+)"', sent.get_data(as_text=True)).group(1)
        answer = client.get(f"/chat/c/{cid}/m/{mid}/lens.json")
        assert answer.status_code == 409 and "still being written" in answer.get_json()["error"]
        page = client.get(f"/chat/c/{cid}/m/{mid}/lens")
        assert page.status_code == 409 and "still being written" in page.get_data(as_text=True)
    finally:
        glassbox(slow).core.shutdown()

    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "Hello", 3)
    with test_ablation.store(chat_app).db.transaction() as db:
        db.execute("UPDATE messages SET intervention = ? WHERE id = ?", ('{"heads": ["9.9"], "mode": "zero"}', mid))
    answer = client.get(f"/chat/c/{cid}/m/{mid}/lens.json")
    assert answer.status_code == 409 and "switched off cannot be read" in answer.get_json()["error"]


def test_lens_jobs_count_against_the_browsers_job_limit(tmp_path):
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.05)},
                   max_jobs_per_owner=1)
    try:
        client = app.test_client()
        sent = send(client, "Hello", max_new_tokens="2")
        url = stream_url(sent.get_data(as_text=True))
        assert sse_events(client.get(url).get_data(as_text=True))[-1][0] == "done"
        cid, mid = url.split("/")[3], int(re.search(r"/m/(\d+)/stream", url).group(1))
        send(client, "And?", conversation_id=cid, max_new_tokens="200")  # running: the browser's one job
        answer = client.get(f"/chat/c/{cid}/m/{mid}/lens.json")
        assert answer.status_code == 429 and "error" in answer.get_json()
    finally:
        glassbox(app).core.shutdown()


def test_inside_on_an_ablated_version_says_it_reads_the_whole_model_not_the_panels_odds(chat_app):
    """Inside runs the model whole: on a version written with parts switched off its last row is not the
    token panel's, and the page says so (and points to the lens, which reads it with the parts off)."""
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "What is a head?", 4)
    plain = client.get(f"/chat/c/{cid}/m/{mid}/inside/0").get_data(as_text=True)
    assert "The last row is the token panel's" in plain and "nothing switched off" not in plain
    new = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": ["1.0"]}).get_json()["message_id"]
    finish(client, cid, new)
    page = client.get(f"/chat/c/{cid}/m/{new}/inside/0").get_data(as_text=True)
    assert "this page reads the whole" in page and "nothing switched off" in page
    assert "The last row is the token panel's" not in page and f"/chat/c/{cid}/m/{new}/lens" in page
