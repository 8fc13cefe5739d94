"""/v1 with the real clients against real gunicorn (gunicorn.conf.py, wsgi:app): the openai package from
PyPI (replies whole and streamed, logprobs, errors, a closed stream cancelling its job) and plain curl,
and the Loop-lab JSON API behind the same key."""

from __future__ import annotations

import json
import socket
import subprocess

import openai
import pytest

from tests.support.servers import Gunicorn, model_env, wait_until
from tests.v1.conftest import KEY, SCRIPT, write_keys

pytestmark = pytest.mark.integration

SYSTEM_AND_USER = [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "Capital?"}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """Says SCRIPT to every chat prompt; API keys required."""
    work = tmp_path_factory.mktemp("v1-scripted")
    env = {**model_env(work, chat_arch="script:" + SCRIPT.encode().hex()),
           "GLASSBOX_API_KEYS": str(write_keys(work / "api_keys", KEY))}
    server = Gunicorn(work / "instance", env).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """50 ms a token, never ends before max_tokens; no keys (open, as the pages); two jobs per owner."""
    work = tmp_path_factory.mktemp("v1-slow")
    env = {**model_env(work, chat_arch="tiny:0.05"), "GLASSBOX_HEARTBEAT_SECONDS": "0.2",
           "GLASSBOX_MAX_JOBS_PER_OWNER": "2"}
    server = Gunicorn(work / "instance", env).start()
    yield server
    server.stop()


def client_of(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "30", *args], capture_output=True, text=True, check=True)


# -- the openai package -----------------------------------------------------------------------------
def test_openai_lists_the_model_and_gets_a_whole_reply_with_logprobs(scripted):
    client = client_of(scripted)
    assert [m.id for m in client.models.list()] == ["glassbox"]
    reply = client.chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, max_tokens=100,
                                           logprobs=True, top_logprobs=2, seed=1)
    choice = reply.choices[0]
    assert choice.message.content == SCRIPT and choice.finish_reason == "stop"
    assert reply.usage.completion_tokens == len(SCRIPT.encode()) and reply.usage.prompt_tokens > 0
    tokens = choice.logprobs.content
    assert b"".join(bytes(t.bytes) for t in tokens) == SCRIPT.encode()
    assert all(t.logprob == 0.0 and t.top_logprobs[0].token == t.token for t in tokens)  # forced: p = 1
    assert tokens[0].top_logprobs[1].logprob == -9999.0  # probability 0, as OpenAI writes it


def test_openai_streams_a_reply(scripted):
    stream = client_of(scripted).chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, stream=True,
                                                         stream_options={"include_usage": True})
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == SCRIPT
    assert [p.choices[0].finish_reason for p in parts if p.choices][-1] == "stop"
    assert parts[-1].choices == [] and parts[-1].usage.completion_tokens == len(SCRIPT.encode())
    assert len(parts) > 10  # token by token, not one lump


def test_openai_stops_at_a_stop_sequence_and_completes_raw_prompts(scripted):
    client = client_of(scripted)
    reply = client.chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, stop=["Paris"])
    assert reply.choices[0].message.content == "The capital of France is " and reply.choices[0].finish_reason == "stop"
    # a raw prompt as token ids: <|bos|><|user_start|>Hi<|user_end|><|assistant_start|>, no template added
    raw = client.completions.create(model="glassbox", prompt=[256, 257, 72, 105, 258, 259], max_tokens=10, logprobs=2)
    assert raw.choices[0].text == SCRIPT[:10] and raw.choices[0].finish_reason == "length"
    assert raw.choices[0].logprobs.tokens == list(SCRIPT[:10]) and raw.usage.prompt_tokens == 6
    streamed = client.completions.create(model="glassbox", prompt=[256, 257, 72, 105, 258, 259], max_tokens=10,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == SCRIPT[:10]


def test_openai_raises_its_own_errors(scripted):
    client = client_of(scripted)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, top_p=0.5)
    assert bad.value.status_code == 400 and bad.value.param == "top_p" and "top_k" in bad.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=SYSTEM_AND_USER)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, n=2)
    with pytest.raises(openai.AuthenticationError) as wrong:
        client_of(scripted, key="sk-not-the-key-000000").models.list()
    assert wrong.value.status_code == 401 and wrong.value.code == "invalid_api_key"


def test_closing_an_openai_stream_cancels_its_job(slow):
    before = slow.metrics()
    stream = client_of(slow, key="anything: no keys are set").chat.completions.create(
        model="glassbox", messages=SYSTEM_AND_USER, max_tokens=200, stream=True)
    for _, _chunk in zip(range(4), stream):
        pass
    stream.close()
    cancelled = 'glassbox_jobs_total{outcome="cancelled"}'
    assert wait_until(lambda: slow.metrics()[cancelled] == before[cancelled] + 1, 10)
    after = slow.metrics()
    assert after["glassbox_running_jobs"] == 0 and after["glassbox_open_streams"] == 0
    assert after["glassbox_tokens_total"] - before["glassbox_tokens_total"] < 100  # stopped early, not 200


def test_hanging_up_on_a_whole_reply_cancels_its_job(slow):
    before = slow.metrics()
    body = json.dumps({"messages": SYSTEM_AND_USER, "max_tokens": 200}).encode()
    with socket.create_connection(("127.0.0.1", slow.port)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_until(lambda: slow.metrics()["glassbox_running_jobs"] == 1, 10)
    cancelled = 'glassbox_jobs_total{outcome="cancelled"}'
    assert wait_until(lambda: slow.metrics()[cancelled] == before[cancelled] + 1, 10)
    assert slow.metrics()["glassbox_open_streams"] == 0


def test_the_per_owner_limit_is_a_rate_limit_error(slow):
    client = client_of(slow)
    streams = [client.chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, max_tokens=200, stream=True)
               for _ in range(2)]
    try:
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="glassbox", messages=SYSTEM_AND_USER, max_tokens=5)
        assert limited.value.status_code == 429
    finally:
        for stream in streams:
            stream.close()
    assert wait_until(lambda: slow.metrics()["glassbox_running_jobs"] == 0, 10)


# -- curl ------------------------------------------------------------------------------------------
def test_curl_gets_a_reply_and_a_stream(scripted):
    auth = ["-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json"]
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}]})
    whole = json.loads(curl(*auth, "-d", body, scripted.url + "/v1/chat/completions").stdout)
    assert whole["choices"][0]["message"]["content"] == SCRIPT
    stream = curl("-N", *auth, "-d", json.dumps({**json.loads(body), "stream": True}),
                  scripted.url + "/v1/chat/completions").stdout
    events = [e for e in stream.split("\n\n") if e and not e.startswith(":")]
    assert all(e.startswith("data: ") and "\n" not in e for e in events) and events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == SCRIPT


def test_curl_hears_why_in_openais_shape(scripted):
    no_key = curl("-w", "\n%{http_code}", "-H", "Content-Type: application/json", "-d", "{}",
                  scripted.url + "/v1/chat/completions").stdout
    body, status = no_key.rsplit("\n", 1)
    assert status == "401" and "API key" in json.loads(body)["error"]["message"]
    form = curl("-w", "\n%{http_code}", "-H", f"Authorization: Bearer {KEY}", "-d", "messages=hi",
                scripted.url + "/v1/chat/completions").stdout
    body, status = form.rsplit("\n", 1)
    assert status == "415" and "application/json" in json.loads(body)["error"]["message"]


def test_the_loop_lab_api_takes_the_same_key(scripted):
    request = json.dumps({"mapping": [[a, b] for a, b in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                                             "BCDEFGHIJKLMNOPQRSTUVWXYZA")],
                          "start": "A", "steps": 3})
    refused = curl("-w", "\n%{http_code}", "-H", "Content-Type: application/json", "-d", request,
                   scripted.url + "/api/loops/trace").stdout
    assert refused.rsplit("\n", 1)[1] == "401"
    lines = curl("-N", "-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json", "-d", request,
                 scripted.url + "/api/loops/trace").stdout.splitlines()
    assert json.loads(lines[-1])["status"] == "complete"
