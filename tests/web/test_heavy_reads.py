"""Heavy read answers (webapp/web/heavy.py): an Inside report's JSON and a saved trace's file are made once and
kept as bytes, served gzip-compressed to a client that takes it (the same JSON), answered 304 to a client that
has them, and counted against the client address (GLASSBOX_HEAVY_READ_BYTES_PER_SECOND): past it 429 with
Retry-After, whatever cookie the client sends or does not send, and another address is not touched."""

from __future__ import annotations

import gzip
import json
import re

import pytest
import torch

from tests.chat.web.test_glass import reply
from tests.conftest import csrf_of, make_app
from tests.loops.web.test_traces import saved_trace
from webapp.chat.inside import view as inside_view
from webapp.chat.inside.service import InsideService
from webapp.loops.store import TraceStore
from webapp.web.counts import HeavyReads
from webapp.web.state import glassbox

GZIP = {"Accept-Encoding": "gzip, deflate"}
NOW = [1000.0]  # the budget's clock, moved by hand: no test waits for it


def app_with(tmp_path, **settings):
    from tests.support.chat_models import tiny_chat_model
    from tests.support.loop_models import bundle
    loaded = tiny_chat_model(tmp_path / "chat")
    first_special = min(loaded.tokenizer.special_ids.values())  # never stops early: every reply has its tokens
    loaded.model.lm_head.register_forward_hook(lambda m, a, logits: logits.index_fill_(
        -1, torch.arange(first_special, logits.size(-1)), float("-inf")))
    app = make_app(tmp_path, {"chat": loaded, "loops": bundle()}, **settings)
    glassbox(app).heavy_reads.clock = lambda: NOW[0]
    return app


@pytest.fixture
def app(tmp_path):
    app = app_with(tmp_path)
    yield app
    glassbox(app).core.shutdown()


@pytest.fixture
def tight(tmp_path):
    """The smallest budget there is: 64 KiB a second, a burst of 128 KiB; the tiny model's Inside JSON (~27 KiB)
    counts as the least any heavy answer does, 64 KiB: two are served, the third waits."""
    app = app_with(tmp_path, heavy_read_bytes_per_second=65536)
    yield app
    glassbox(app).core.shutdown()


def shared_inside(client, content="Hello there, tell me more", tokens="24") -> tuple[str, str]:
    """A finished reply, shared -> (the owner's Inside JSON URL, the share link's) of its last token."""
    cid, mid, _ = reply(client, content, max_new_tokens=tokens, temperature="0")
    client.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(client, f"/chat/c/{cid}")})
    token = re.search(r"/chat/shared/([\w-]+)", client.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    last = int(tokens) - 1
    return f"/chat/c/{cid}/m/{mid}/inside/{last}.json", f"/chat/shared/{token}/m/{mid}/inside/{last}.json"


def test_the_inside_json_is_made_once_and_served_the_same_gzip_or_plain(app, monkeypatch):
    client = app.test_client()
    own, shared = shared_inside(client)
    made = []
    as_json = inside_view.as_json
    monkeypatch.setattr(inside_view, "as_json", lambda *a: made.append(1) or as_json(*a))
    plain = client.get(own)
    assert plain.status_code == 200 and "Content-Encoding" not in plain.headers
    assert "Accept-Encoding" in plain.headers["Vary"] and plain.headers["Content-Type"] == "application/json"
    packed = client.get(own, headers=GZIP)
    assert packed.headers["Content-Encoding"] == "gzip" and len(packed.data) < len(plain.data) / 2
    assert json.loads(gzip.decompress(packed.data)) == plain.get_json()
    assert plain.get_json()["token"]["index"] == 23 and len(plain.get_json()["attention"]["weights"]) == 2
    assert client.get(shared, headers={"Accept-Encoding": "gzip;q=0, identity"}).data == plain.data  # refused: plain
    assert made == [1]  # serialised once: the owner's, gzip or not, and the share link's are the same bytes
    kept = glassbox(app).service(InsideService).kept._made  # kept with its report
    assert [what["json"].body for what in kept.values()] == [plain.data]
    etag = plain.headers["ETag"]
    again = client.get(own, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.data == b"" and again.headers["ETag"] == etag
    assert client.get(own, headers={"If-None-Match": '"other"'}).status_code == 200


def test_a_trace_file_is_read_and_made_once_and_served_the_same_gzip_or_plain(app, monkeypatch):
    client = app.test_client()
    trace_id = saved_trace(client, csrf_of(client, "/loops/"), steps="12")
    reads = []
    get = TraceStore.get
    monkeypatch.setattr(TraceStore, "get", lambda self, *a: reads.append(a) or get(self, *a))
    plain = client.get(f"/loops/traces/{trace_id}.json")
    packed = client.get(f"/loops/traces/{trace_id}.json", headers=GZIP)
    assert plain.status_code == packed.status_code == 200 and packed.headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(packed.data)) == plain.get_json() and len(plain.get_json()["trace"]) == 12
    assert b", " not in plain.data  # compact, as before: a long run's file must fit an upload
    assert "attachment" in packed.headers["Content-Disposition"]
    assert len(reads) == 1  # the snapshot read and serialised once
    assert app.test_client().get(f"/loops/traces/{trace_id}.json").status_code == 404  # kept, still the owner's


def test_past_its_budget_an_address_gets_429_with_retry_after_and_another_does_not(tight):
    client = tight.test_client()
    own, shared = shared_inside(client)
    NOW[0] += 100  # what making the reply read is paid back
    assert [client.get(own).status_code for _ in range(2)] == [200, 200]
    refused = client.get(own)
    assert refused.status_code == 429 and "GLASSBOX_HEAVY_READ_BYTES_PER_SECOND" in refused.get_json()["error"]
    assert refused.headers["Retry-After"] == "1"  # none left: a second brings 64 KiB back
    page = client.get(own.removesuffix(".json"))  # the page counts too, refused as a page
    assert page.status_code == 429 and page.headers["Retry-After"] == "1"
    assert "large answers" in page.get_data(as_text=True)
    other = tight.test_client()  # another address, with no cookie either
    assert other.get(shared, environ_base={"REMOTE_ADDR": "127.0.0.9"}).status_code == 200
    NOW[0] += 1
    assert client.get(own).status_code == 200  # paid back
    assert client.get(own).status_code == 429


def test_a_client_without_cookies_is_counted_by_its_address(tight):
    owner = tight.test_client()
    _, shared = shared_inside(owner)
    NOW[0] += 100
    answers = []
    for _ in range(3):  # a fresh client each time: no cookie to shed
        script = tight.test_client(use_cookies=False)
        answers.append(script.get(shared, environ_base={"REMOTE_ADDR": "127.0.0.7"}))
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].headers["Retry-After"] == "1" and "Set-Cookie" not in answers[2].headers


def test_the_budget_fills_back_up_and_forgets_quiet_addresses():
    now = [0.0]
    reads = HeavyReads(1000, clock=lambda: now[0])
    assert reads.wait("a") == 0
    reads.take("a", 1500)
    assert reads.wait("a") == 0  # 500 of the 2,000-byte burst left
    reads.take("a", 1500)
    assert reads.wait("a") == pytest.approx(1.0, abs=0.01)  # 1,000 owed at 1,000 a second
    now[0] = 1.01
    assert reads.wait("a") == 0 and reads.wait("b") == 0
    assert HeavyReads(0).wait("a") == 0  # 0: no limit
    quiet = HeavyReads(1000, clock=lambda: now[0])
    quiet.MAX_ADDRESSES = 3
    for address in "abc":
        quiet.take(address, 10)
    now[0] = 20.0
    quiet.take("d", 10)
    assert set(quiet._level) == {"d"}  # the others were full again, as good as new: forgotten
    for address in "efg":
        quiet.take(address, 10)
    assert set(quiet._level) == {"g"}  # a flood of live addresses: started over rather than grown


def test_a_json_url_answers_its_refusals_and_errors_as_json_whatever_the_client_accepts(tight):
    client = tight.test_client()
    trace_id = saved_trace(client, csrf_of(client, "/loops/"), steps="12")
    browser_like = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    missing = client.get("/loops/traces/0000nosuch.json", headers=browser_like)
    assert missing.status_code == 404 and missing.get_json() == {"error": "No such trace."}
    NOW[0] += 100
    statuses = [client.get(f"/loops/traces/{trace_id}.json", headers=browser_like) for _ in range(3)]
    refused = statuses[-1]
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert "GLASSBOX_HEAVY_READ_BYTES_PER_SECOND" in refused.get_json()["error"]
    page = client.get(f"/loops/traces/{trace_id}", headers=browser_like)  # a page's error stays a page
    assert page.mimetype == "text/html"


def test_a_heavy_read_s_cpu_time_counts_against_the_bulk_share_and_a_page_s_does_not(tight, monkeypatch):
    core = glassbox(tight).core
    charged: list[float] = []
    charge = core.charge_bulk
    monkeypatch.setattr(core, "charge_bulk", lambda seconds: charged.append(seconds) or charge(seconds))
    client = tight.test_client()
    own, _ = shared_inside(client)
    NOW[0] += 100
    charged.clear()
    assert client.get(own).status_code == 200  # worked out, made into JSON: bulk
    assert len(charged) == 1 and charged[0] > 0
    assert client.get("/chat/").status_code == 200  # a page
    assert len(charged) == 1
    client.get(own), client.get(own)  # one more served, then one refused (429): refusing costs too
    assert len(charged) == 3


def test_an_answer_is_compressed_only_once_a_client_takes_gzip_and_then_once(app, monkeypatch):
    import webapp.web.encoded as encoded
    compressed = []
    compress = encoded.gzip.compress
    monkeypatch.setattr(encoded.gzip, "compress", lambda *a, **k: compressed.append(1) or compress(*a, **k))
    client = app.test_client()
    own, _ = shared_inside(client)
    assert client.get(own, headers={"Accept-Encoding": "identity"}).status_code == 200
    assert compressed == []  # read plain: never compressed
    packed = [client.get(own, headers=GZIP) for _ in range(2)]
    assert [p.headers.get("Content-Encoding") for p in packed] == ["gzip", "gzip"]
    assert compressed == [1] and gzip.decompress(packed[1].data) == client.get(own).data
