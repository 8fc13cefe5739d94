"""/v1 through Flask's test client: the shapes of replies, streams and errors, the odds as logprobs,
stop sequences, owners, and the API keys (for /v1 and the Loop-lab JSON API alike)."""

from __future__ import annotations

import json
import math
import string

import pytest

from tests.conftest import make_app, sse_events
from tests.v1.conftest import KEY, OTHER_KEY, SCRIPT, submitted_jobs, write_keys
from webapp.chat.decode.generate import generate
from webapp.config import ConfigError
from webapp.web.state import glassbox
from webapp.web.streams import open_streams

HI = [{"role": "user", "content": "Hi"}]


def chat(client, headers=None, **body):
    return client.post("/v1/chat/completions", json={"messages": HI, **body}, headers=headers or {})


def chunks(response) -> list:
    """The stream's `data:` payloads, as OpenAI frames them: no event names, [DONE] last."""
    events = sse_events(response.get_data(as_text=True))
    assert all(name == "message" for name, _ in events)
    assert events[-1][1] == "[DONE]"
    return [json.loads(data) for _, data in events[:-1]]


def test_models_lists_the_one_chat_model(api_app):
    listing = api_app.test_client().get("/v1/models").json
    assert [m["id"] for m in listing["data"]] == ["glassbox"] and listing["object"] == "list"
    card = api_app.test_client().get("/v1/models/glassbox").json
    assert card["object"] == "model" and card["context_length"] == 512
    assert api_app.test_client().get("/v1/models/gpt-4").status_code == 404


@pytest.mark.parametrize("how", ["config.json beside", "arch file", "factory file"])
def test_the_model_list_names_files_never_the_servers_folders(tmp_path, how):
    """/v1/models answers anyone without a key: the checkpoint is `name@sha`, and the description says
    where the config came from by file name only."""
    from tests.support.chat_models import tiny_checkpoint
    from webapp.chat.model.loading import load_chat_model
    folder = tmp_path / "secret-folder"
    checkpoint = tiny_checkpoint(folder / "chat")
    arch = folder / "arch.json"
    arch.write_text(json.dumps({"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 512, "vocab_size": 264}))
    if how == "config.json beside":
        loaded = load_chat_model(str(checkpoint))
    elif how == "arch file":
        loaded = load_chat_model(str(checkpoint), arch=str(arch))
    else:
        factory = folder / "factory.py"
        factory.write_text("from webapp.chat.model.gpt import GPT, GPTConfig\n"
                           "def build(arch):\n"
                           "    return GPT(GPTConfig(block_size=512, vocab_size=264, n_layer=2, n_head=2,\n"
                           "                         n_embd=32))\n")
        loaded = load_chat_model(str(checkpoint), factory=f"{factory}:build", arch=str(arch))
    app = make_app(tmp_path, {"chat": loaded})
    try:
        client = app.test_client()
        for answer in (client.get("/v1/models"), client.get("/v1/models/glassbox")):
            assert answer.status_code == 200
            assert "secret-folder" not in answer.get_data(as_text=True), answer.json
        card = client.get("/v1/models/glassbox").json
        assert card["checkpoint"].startswith("model.safetensors@")
        named = {"config.json beside": "config from config.json", "arch file": "config from arch.json",
                 "factory file": "factory factory.py:build('arch.json')"}[how]
        assert named in card["description"]
    finally:
        glassbox(app).core.shutdown()


def test_a_reply_has_openais_shape_and_the_same_tokens_and_odds_as_alone(api_app):
    r = chat(api_app.test_client(), max_tokens=12, seed=3, temperature=0.8, top_k=20, logprobs=True, top_logprobs=3)
    assert r.status_code == 200, r.json
    body = r.json
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["system_fingerprint"].startswith("fp_") and body["model"] == "glassbox"
    assert choice["message"]["role"] == "assistant"
    loaded = glassbox(api_app).core.models["chat"]
    prompt = loaded.prompt.build(HI, 12)
    # the generator as the app runs it: the prompt's head from the prefix cache pinned at boot (a cold prefill
    # of the whole prompt sums attention over other lengths: on some CPUs its last bits differ)
    pieces = [p for p in generate(loaded, prompt, max_new_tokens=12, temperature=0.8, top_k=20, seed=3, odds=True,
                                  prefix_cache=loaded.prefix_cache)]
    alone = [p for p in pieces if p.token is not None]
    assert choice["message"]["content"] == "".join(p.text for p in pieces)
    content = choice["logprobs"]["content"]
    assert [e["bytes"] for e in content] == [list(bytes([p.token])) for p in alone]
    for entry, piece in zip(content, alone):
        assert entry["logprob"] == pytest.approx(math.log(piece.odds.probability), abs=1e-12)
        assert entry["rank"] == piece.odds.rank and len(entry["top_logprobs"]) == 3
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(
            [math.log(p) for _, p, _ in piece.odds.alternatives[:3]])
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(alone),
                             "total_tokens": len(prompt) + len(alone)}
    assert choice["finish_reason"] == ("length" if len(alone) == 12 else "stop")


def test_a_stream_is_framed_as_openai_frames_it(api_app):
    r = chat(api_app.test_client(), max_tokens=8, seed=1, stream=True, stream_options={"include_usage": True})
    assert r.mimetype == "text/event-stream" and r.headers["X-Accel-Buffering"] == "no"
    parts = chunks(r)
    assert parts[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(p["object"] == "chat.completion.chunk" and p["id"] == parts[0]["id"] for p in parts)
    assert parts[-2]["choices"][0]["delta"] == {} and parts[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert parts[-1]["choices"] == [] and parts[-1]["usage"]["completion_tokens"] <= 8
    whole = chat(api_app.test_client(), max_tokens=8, seed=1).json
    streamed = "".join(p["choices"][0]["delta"].get("content", "") for p in parts[:-1])
    assert streamed == whole["choices"][0]["message"]["content"]  # same seed, same reply


def test_stop_sequences_end_the_reply_and_are_not_sent(script_app):
    client = script_app.test_client()
    full = chat(client, logprobs=True).json["choices"][0]
    assert full["message"]["content"] == SCRIPT and full["finish_reason"] == "stop"
    assert len(full["logprobs"]["content"]) == len(SCRIPT.encode())  # one byte a token
    kept = SCRIPT[:SCRIPT.index("ND")]
    for stream in (False, True):
        r = chat(client, stop=["Paris!", "ND"], stream=stream, logprobs=True)
        if stream:
            parts = chunks(r)
            text = "".join(p["choices"][0]["delta"].get("content", "") for p in parts)
            finish = parts[-1]["choices"][0]["finish_reason"]
            tokens = [e for p in parts if p["choices"][0]["logprobs"] for e in p["choices"][0]["logprobs"]["content"]]
        else:
            choice = r.json["choices"][0]
            text, finish, tokens = choice["message"]["content"], choice["finish_reason"], choice["logprobs"]["content"]
        assert (text, finish) == (kept, "stop")
        assert b"".join(bytes(t["bytes"]) for t in tokens) == kept.encode()  # the stop's tokens are not sent
    raw = client.post("/v1/completions", json={"prompt": [256, 257, 72, 105, 258, 259], "max_tokens": 40,
                                               "stop": "Paris", "logprobs": 0}).json["choices"][0]
    assert raw["text"] == "The capital of France is " and raw["finish_reason"] == "stop"
    assert raw["logprobs"]["text_offset"] == list(range(len(raw["text"])))


def test_errors_have_openais_shape_and_status(api_app):
    client = api_app.test_client()
    for response, status in [(chat(client, top_p=0.5), 400), (chat(client, model="gpt-4o"), 404),
                             (client.post("/v1/chat/completions", data="{"), 415),
                             (client.post("/v1/chat/completions", data="{", content_type="application/json"), 400),
                             (client.post("/v1/embeddings", json={}), 404), (client.get("/v1/chat/completions"), 404),
                             (client.post("/v1/chat/completions", json={"messages": [{"content": "x" * 300_000}]}),
                              413)]:
        assert response.status_code == status, response.data
        error = response.json["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


def test_a_model_failure_mid_stream_is_an_error_chunk(api_app):
    loaded = glassbox(api_app).core.models["chat"]
    calls = {"n": 0}

    def fail_later(module, args, logits):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("Nonfinite model output")
        logits[..., 256:] = float("-inf")  # no special token: the reply cannot end before it fails
        return logits
    hook = loaded.model.lm_head.register_forward_hook(fail_later)
    try:
        parts = chunks(chat(api_app.test_client(), max_tokens=50, stream=True))
        assert "Nonfinite model output" in parts[-1]["error"]["message"]
        assert parts[-1]["error"]["type"] == "server_error"
        calls["n"] = 0
        r = chat(api_app.test_client(), max_tokens=50)
        assert r.status_code == 500 and "Nonfinite" in r.json["error"]["message"]
    finally:
        hook.remove()


def test_the_api_never_uses_a_browsers_cookie_or_conversations(api_app):
    client = api_app.test_client()
    page = client.get("/chat/")  # a browser: its session cookie then goes with every request, /v1's too
    assert "Set-Cookie" in page.headers
    jobs = submitted_jobs(api_app)
    r = chat(client, max_tokens=2)
    assert r.status_code == 200 and "Set-Cookie" not in r.headers
    assert jobs[0].owner == "api:127.0.0.1"  # no keys: the client's address, never the browser's owner
    assert jobs[0].request.odds is False  # odds are computed only when logprobs are asked for


def test_the_per_owner_limit_answers_429_rate_limit(tmp_path):
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02)}, max_jobs_per_owner=1)
    try:
        first = chat(app.test_client(), max_tokens=200, stream=True)  # its body is not read yet: still running
        stream = first.response
        next(stream)
        second = chat(app.test_client(), max_tokens=5)
        assert second.status_code == 429 and second.json["error"]["code"] == "rate_limit_exceeded"
        first.close()
        assert open_streams(app).count == 0
    finally:
        glassbox(app).core.shutdown()


# -- API keys -------------------------------------------------------------------------------------
LOOP_REQUEST = {"mapping": [[a, string.ascii_uppercase[(i + 1) % 26]] for i, a in enumerate(string.ascii_uppercase)],
                "start": "A", "steps": 3}


def test_with_keys_every_api_request_needs_one(keyed_app):
    client = keyed_app.test_client()
    missing = chat(client, max_tokens=2)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert missing.json["error"]["type"] == "invalid_request_error" and "API key" in missing.json["error"]["message"]
    wrong = chat(client, {"Authorization": "Bearer not-a-key-at-all-1234"}, max_tokens=2)
    assert wrong.status_code == 401 and wrong.json["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models").status_code == 401
    assert chat(client, {"Authorization": f"Bearer {KEY}"}, max_tokens=2).status_code == 200
    # the Loop-lab JSON API takes the same key, and answers in its own error shape
    loops = client.post("/api/loops/trace", json=LOOP_REQUEST)
    assert loops.status_code == 401 and loops.json == {"error": missing.json["error"]["message"]}
    assert loops.headers["WWW-Authenticate"] == missing.headers["WWW-Authenticate"]
    for url in ("/api/loops/trace", "/v1/chat/completions"):  # the key is checked first, whatever was sent
        assert client.post(url, data="not JSON", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = client.post("/api/loops/trace", json=LOOP_REQUEST, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and json.loads(ok.get_data(as_text=True).splitlines()[-1])["status"] == "complete"
    assert client.get("/chat/").status_code == 200  # the pages need no key


def test_each_key_is_its_own_owner(keyed_app):
    jobs = submitted_jobs(keyed_app)
    for key in (KEY, OTHER_KEY, KEY):
        assert chat(keyed_app.test_client(), {"Authorization": f"Bearer {key}"}, max_tokens=1).status_code == 200
    owners = [j.owner for j in jobs]
    assert owners[0] == owners[2] != owners[1] and all(o.startswith("api:key-") for o in owners)
    assert KEY not in owners[0]


def test_the_keys_file_is_read_again_when_it_changes(keyed_app, tmp_path):
    client = keyed_app.test_client()
    write_keys(tmp_path / "api_keys", "a-brand-new-key-0123456789")
    assert chat(client, {"Authorization": f"Bearer {KEY}"}, max_tokens=1).status_code == 401
    assert chat(client, {"Authorization": "Bearer a-brand-new-key-0123456789"}, max_tokens=1).status_code == 200


@pytest.mark.parametrize("content, message", [("", "no keys"), ("short\n", "at least 16"), (None, "cannot read")])
def test_a_bad_keys_file_stops_start_up(tmp_path, content, message):
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        make_app(tmp_path, {}, api_keys=str(path))


def test_the_per_owner_limit_counts_loop_api_runs_per_key(tmp_path):
    """Each key is one owner for /api/loops/trace too: cookie-less runs were each a throwaway owner."""
    from tests.support.chat_models import tiny_chat_model
    from tests.support.loop_models import bundle
    keys = write_keys(tmp_path / "api_keys", KEY, OTHER_KEY)
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat"), "loops": bundle(delay=0.2)},
                   api_keys=str(keys), max_jobs_per_owner=2, max_jobs_per_client=100)
    try:
        runs = []
        for _ in range(3):  # bodies not read: the runs are still queued or running
            runs.append(app.test_client().post("/api/loops/trace", json={**LOOP_REQUEST, "steps": 20},
                                               headers={"Authorization": f"Bearer {KEY}"}))
        assert [r.status_code for r in runs] == [200, 200, 429]
        assert "error" in runs[2].json
        other = app.test_client().post("/api/loops/trace", json=LOOP_REQUEST,
                                       headers={"Authorization": f"Bearer {OTHER_KEY}"})
        assert other.status_code == 200  # another key has its own allowance
        for r in reversed(runs + [other]):  # streamed contexts end in the reverse order they began
            r.close()
    finally:
        glassbox(app).core.shutdown()


def test_a_stream_of_tokens_that_make_no_text_still_writes_heartbeats():
    # Without them a client that left is never noticed: the reply would run to its length for nobody.
    import threading

    from webapp.chat.decode.publish import TokenEvent
    from webapp.chat.decode.types import SamplingParams
    from webapp.core.jobs import DONE, RUNNING, Job
    from webapp.v1.params import Ask
    from webapp.v1.replies import Follow

    job = Job("chat", "api:test", None)
    job.set_state(RUNNING)
    follow = Follow(job, Ask("text", (1,), SamplingParams(max_new_tokens=400)), heartbeat=0.05)
    stop = threading.Event()

    def tokens_without_text():
        for index in range(400):
            if stop.wait(0.005):
                return
            job.keep("token", TokenEvent("", index, 200, None))  # e.g. the first bytes of a character
        job.set_state(DONE)

    writer = threading.Thread(target=tokens_without_text)
    writer.start()
    updates = follow.updates()
    try:
        first = next(updates)
        assert first is None  # a heartbeat while tokens arrive that make nothing to send
    finally:
        stop.set()
        updates.close()
        writer.join()
