"""Request parsing (webapp/v1/params.py) and stop sequences (webapp/v1/replies.py StopText), without a server."""

from __future__ import annotations

import pytest

from webapp.config import Settings
from webapp.v1.errors import ApiError
from webapp.v1.params import DEFAULT_TOP_K, chat_turns, parse_chat, parse_text
from webapp.v1.replies import StopText

SETTINGS = Settings()
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.chat_models import tiny_chat_model
    return tiny_chat_model(tmp_path_factory.mktemp("chat"))


def refused(parse, body, loaded) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(body, loaded, SETTINGS)
    return caught.value


def test_a_chat_request_is_the_chat_pages_prompt_with_openais_defaults(loaded):
    ask = parse_chat({"model": "glassbox", "messages": HI}, loaded, SETTINGS)
    assert list(ask.prompt_ids) == loaded.prompt.build(HI, SETTINGS.max_new_tokens)
    p = ask.params
    assert (p.temperature, p.top_k, p.seed, p.max_new_tokens) == (1.0, DEFAULT_TOP_K, None, SETTINGS.max_new_tokens)
    assert (ask.stream, ask.stops, ask.logprobs) == (False, (), None)


def test_sampling_fields_are_taken(loaded):
    ask = parse_chat({"messages": HI, "temperature": 0, "top_k": 0, "seed": 7, "max_completion_tokens": 9,
                      "max_tokens": 99, "stop": ["\n", ""], "logprobs": True, "top_logprobs": 20, "top_p": 1,
                      "n": 1, "stream": True, "stream_options": {"include_usage": True}, "user": "ignored"},
                     loaded, SETTINGS)
    assert (ask.params.temperature, ask.params.top_k, ask.params.seed) == (0.0, 0, 7)
    assert ask.params.max_new_tokens == 9  # max_completion_tokens wins over max_tokens
    assert ask.stops == ("\n",)  # an empty stop sequence would stop every reply at once
    assert ask.logprobs == 10  # 20 asked; the odds keep the 10 most likely tokens
    assert ask.stream and ask.include_usage


def test_system_messages_go_before_the_next_user_message():
    messages = [("system", "Be brief."), ("developer", "Be kind."), ("user", "Hi"), ("assistant", "Hello"),
                ("user", "Bye"), ("system", "Last words.")]
    assert chat_turns(messages) == [{"role": "user", "content": "Be brief.\n\nBe kind.\n\nHi"},
                                    {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"},
                                    {"role": "user", "content": "Last words."}]


def test_content_parts_of_text_are_joined(loaded):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    ask = parse_chat({"messages": parts}, loaded, SETTINGS)
    assert list(ask.prompt_ids) == loaded.prompt.build([{"role": "user", "content": "a\nb"}], SETTINGS.max_new_tokens)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    assert "text parts only" in refused(parse_chat, {"messages": image}, loaded).message


@pytest.mark.parametrize("body, param, status", [
    ({"messages": []}, "messages", 400),
    ({"messages": HI, "model": "gpt-4o"}, "model", 404),
    ({"messages": HI, "n": 2}, "n", 400),
    ({"messages": HI, "top_p": 0.9}, "top_p", 400),
    ({"messages": HI, "presence_penalty": 0.5}, "presence_penalty", 400),
    ({"messages": HI, "logit_bias": {"1": 5}}, "logit_bias", 400),
    ({"messages": HI, "tools": [{"type": "function"}]}, "tools", 400),
    ({"messages": HI, "temperature": 2.5}, "temperature", 400),
    ({"messages": HI, "temperature": "hot"}, "temperature", 400),
    ({"messages": HI, "max_tokens": 0}, "max_tokens", 400),
    ({"messages": HI, "max_tokens": True}, "max_tokens", 400),
    ({"messages": HI, "max_tokens": 10**6}, "max_tokens", 400),
    ({"messages": HI, "top_logprobs": 3}, "top_logprobs", 400),
    ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs", 400),
    ({"messages": HI, "stop": ["a", "b", "c", "d", "e"]}, "stop", 400),
    ({"messages": HI, "stream_options": {"include_usage": True}}, "stream_options", 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", 400),
    ({"messages": [{"role": "user", "content": "x" * 9000}]}, "messages[0].content", 400),
])
def test_bad_chat_requests_are_refused_naming_the_field(loaded, body, param, status):
    error = refused(parse_chat, body, loaded)
    assert (error.status, error.param) == (status, param)
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_a_message_longer_than_the_window_is_refused_as_openai_does(loaded):
    error = refused(parse_chat, {"messages": [{"role": "user", "content": "x" * 7000}], "max_tokens": 10}, loaded)
    assert error.code == "context_length_exceeded" and error.status == 400


def test_a_raw_prompt_has_no_template(loaded):
    ask = parse_text({"prompt": "Hello"}, loaded, SETTINGS)
    assert ask.prompt_ids == tuple(b"Hello") and ask.params.max_new_tokens == 16  # OpenAI's default
    ids = parse_text({"prompt": [[256, 257, 72, 258, 259]], "logprobs": 5}, loaded, SETTINGS)
    assert ids.prompt_ids == (256, 257, 72, 258, 259) and ids.logprobs == 5  # token ids: specials allowed


@pytest.mark.parametrize("body, param", [
    ({"prompt": ""}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 999]}, "prompt"),
    ({"prompt": 5}, "prompt"), ({"prompt": "a", "echo": True}, "echo"), ({"prompt": "a", "best_of": 2}, "best_of"),
    ({"prompt": "a", "logprobs": 6}, "logprobs"), ({"prompt": "a", "max_tokens": 600}, "max_tokens"),
])
def test_bad_completion_requests_are_refused(loaded, body, param):
    assert refused(parse_text, body, loaded).param == param


def feed(stops, pieces):
    scan, out = StopText(tuple(stops)), []
    for i, piece in enumerate(pieces):
        scan.add(piece, (i, None))
        if scan.stopped:
            break
        out.append(scan.take())
    out.append(scan.take(final=True))
    return scan, "".join(t for t, _ in out), [tok[1] for _, toks in out for tok in toks]


def test_stop_sequences_cut_the_text_even_across_tokens():
    scan, text, tokens = feed(["END"], ["Hello ", "E", "N", "D", " more"])
    assert scan.stopped and text == "Hello " and tokens == [0]  # the tokens of the stop sequence are not sent
    scan, text, tokens = feed(["\n\n", "##"], ["a", "b\n", "\nc"])
    assert text == "ab" and tokens == [0, 1]


def test_text_that_might_start_a_stop_sequence_is_held_back_until_settled():
    scan = StopText(("END",))
    scan.add("Hi E", (0, None))
    assert scan.take() == ("Hi ", [(0, 0, None)])  # "E" might begin END
    scan.add("ND?", (1, None))
    assert scan.stopped and scan.take(final=True) == ("", [])
    scan = StopText(("END",))
    scan.add("Hi E", (0, None))
    scan.take()
    scan.add("arth", (1, None))
    assert scan.take() == ("Earth", [(4, 1, None)])


def test_without_stop_sequences_everything_goes_out_at_once():
    scan = StopText(())
    scan.add("", (0, None))  # a byte inside a character: its token goes with the character's text
    assert scan.take() == ("", [])
    scan.add("é", (1, None))
    assert scan.take() == ("é", [(0, 0, None), (0, 1, None)])
