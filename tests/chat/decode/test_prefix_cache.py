"""Prefix reuse: a follow-up turn prefills only what follows the unchanged prefix, and samples exactly
the tokens a cold run with the same seed samples."""

import dataclasses

import pytest
import torch

from tests.chat.decode.test_generate import TINY, tiny
from webapp.chat.decode.generate import generate
from webapp.chat.decode.prefill import pin_prompt_head
from webapp.chat.decode.prefix_cache import PrefixCache, common_prefix
from webapp.chat.model.edits import Edit, HeadEdit
from webapp.chat.model.precision import apply_precision
from webapp.web.state import glassbox

BIG = dataclasses.replace(TINY, block_size=384)


def reply(loaded, prompt, prefix=None, seed=5, max_new_tokens=12, **kw):
    """-> (sampled ids, stats)"""
    pieces = list(generate(loaded, prompt, seed=seed, temperature=1.0, top_k=20, max_new_tokens=max_new_tokens,
                           prefix_cache=prefix, **kw))
    return [p.token for p in pieces[:-1]], pieces[-1].stats


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5], [6]) == 0


def test_follow_up_reuses_the_prefix_and_samples_the_cold_tokens():
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    first = [(5 * i) % 250 for i in range(150)]  # longer than one prefill chunk
    answer, _ = reply(loaded, first, prefix, max_new_tokens=10)
    second = first + answer + [256, 7, 8, 9, 257, 259]  # the reply, then a new user turn
    warm, cold = reply(loaded, second, prefix), reply(loaded, second)
    assert warm[0] == cold[0] and len(warm[0]) == 12
    # turn 1 fed its prompt and every reply token but the last (sampled, never run) to the model
    assert warm[1].reused_tokens == len(first) + 9 and cold[1].reused_tokens == 0
    assert prefix.hits == 1 and prefix.reused_tokens == warm[1].reused_tokens


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_a_reduced_precisions_16_bit_cache_is_reused_too(precision):
    loaded = tiny(config=BIG, endless=True)
    apply_precision(loaded.model, precision)
    prefix = PrefixCache()
    prompt = [(3 * i) % 250 for i in range(200)]
    first = reply(loaded, prompt, prefix)
    again = reply(loaded, prompt, prefix)
    assert first[0] == again[0] and again[1].reused_tokens == len(prompt) - 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_prompt_again_reuses_all_but_the_last_token(seed):
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    prompt = [(3 * i + seed) % 250 for i in range(200)]
    first = reply(loaded, prompt, prefix, seed=seed)
    again = reply(loaded, prompt, prefix, seed=seed)
    assert first[0] == again[0] and first[1].reused_tokens == 0
    assert again[1].reused_tokens == len(prompt) - 1  # the last is run again: its logits pick token 1


def test_a_different_prompt_reuses_only_the_common_part():
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    reply(loaded, [1, 2, 3, 4, 5, 6], prefix)
    changed = [1, 2, 3, 9, 9, 9, 9]
    warm, cold = reply(loaded, changed, prefix), reply(loaded, changed)
    assert warm[1].reused_tokens == 3 and warm[0] == cold[0]


def test_the_cache_is_taken_while_a_generation_runs():
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    prompt = list(range(40))
    reply(loaded, prompt, prefix)
    running = generate(loaded, prompt, seed=1, max_new_tokens=30, prefix_cache=prefix)
    next(running)  # holds the cache now
    assert reply(loaded, prompt, prefix)[1].reused_tokens == 0  # never shares it: starts cold
    running.close()  # closed at a yield, as a cancelled job closes it: its cache is consistent
    assert reply(loaded, prompt, prefix)[1].reused_tokens == len(prompt) - 1


def test_a_failed_generation_drops_the_cache():
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    prompt = list(range(40))
    reply(loaded, prompt, prefix)

    def boom(module, args, output):
        raise RuntimeError("device lost")

    handle = loaded.model.transformer.h[1].attn.c_attn.register_forward_hook(boom)  # mid-forward
    with pytest.raises(RuntimeError, match="device lost"):
        reply(loaded, prompt + [1, 2], prefix)
    handle.remove()
    assert reply(loaded, prompt, prefix)[1].reused_tokens == 0


def test_a_cancelled_generation_keeps_what_it_computed():
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    prompt, polls = list(range(60)), []
    ids, stats = reply(loaded, prompt, prefix, max_new_tokens=30, should_stop=lambda: polls.append(1) or len(polls) > 4)
    assert stats.stop_reason == "cancelled" and len(ids) == 4
    follow_up = prompt + ids + [1, 2]
    assert reply(loaded, follow_up, prefix)[1].reused_tokens == len(prompt) + 3


def test_a_model_in_another_dtype_starts_cold():
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    prompt = list(range(30))
    reply(loaded, prompt, prefix)
    loaded.model.to(torch.float64)
    assert reply(loaded, prompt, prefix)[1].reused_tokens == 0


def test_window_slides_past_block_size_with_a_prefix_cache():
    loaded, prefix = tiny(endless=True), PrefixCache()  # block_size 32
    prompt = [(7 * i) % 256 for i in range(40)]  # longer than the window
    warm = [reply(loaded, prompt, prefix, max_new_tokens=10) for _ in range(2)]
    cold = reply(loaded, prompt, max_new_tokens=10)
    assert warm[0][0] == warm[1][0] == cold[0]
    assert warm[1][1].reused_tokens == 0  # the slid window's last positions no longer start with the prompt


def test_entries_are_kept_by_model_and_variant():
    a, b = tiny().model, tiny().model
    holder, p = PrefixCache(), next(a.parameters())
    holder.put(a.new_cache(1, 32), [1, 2, 3], a)
    holder.put(a.new_cache(1, 32), [1, 2, 3], a, variant="edited")
    assert holder.take([1, 2, 3, 4], p.device, p.dtype, b) is None  # another model's keys and values
    assert holder.take([1, 2, 3, 4], p.device, p.dtype, a, "other") is None  # another edit's
    assert holder.take([1, 2, 3, 4], p.device, p.dtype, a, "edited").variant == "edited"
    assert holder.take([1, 2, 3, 4], p.device, p.dtype, a, "edited") is None
    assert holder.take([1, 2, 3, 4], p.device, p.dtype, a).variant is None
    holder.pin(a.new_cache(1, 8), [1, 2], 32, a)
    assert holder.peek([1, 2, 5], a)[1] == 2 and holder.peek([1, 2, 5], b) == (None, 0)
    assert holder.take([1, 2, 5], p.device, p.dtype, a, "edited") is None  # the head is the plain run's


def test_an_edited_reply_has_a_kv_cache_of_its_own_alone():
    """An edited run (parts switched off) neither starts from a kept cache nor leaves its own in the holder,
    not even for the same edit: the prefix cache never holds an edited run's keys and values."""
    loaded, prefix = tiny(config=BIG, endless=True), PrefixCache()
    zero = Edit(heads=(HeadEdit(layer=0, head=1),))
    prompt = [(5 * i) % 250 for i in range(30)]
    reply(loaded, prompt, prefix, max_new_tokens=6)
    kept = [(entry.cache, list(entry.ids)) for entry in prefix._entries]
    edited = reply(loaded, prompt, prefix, max_new_tokens=6, edit=zero)
    assert edited[1].reused_tokens == 0  # the plain reply's cache is not for it
    assert [(entry.cache, entry.ids) for entry in prefix._entries] == kept  # nothing of the edited run kept
    assert all(entry.variant is None for entry in prefix._entries)
    again = reply(loaded, prompt, prefix, max_new_tokens=6, edit=Edit(heads=(HeadEdit(0, 1),)))  # the same edit
    assert again[1].reused_tokens == 0 and again[0] == edited[0]
    assert reply(loaded, prompt, prefix, max_new_tokens=6)[1].reused_tokens == len(prompt) - 1  # its own
    assert reply(loaded, prompt, max_new_tokens=6, edit=zero)[0] == edited[0]  # cold: the same reply


def test_a_follow_up_message_in_the_app_reuses_the_first_turn(chat_app):
    from tests.chat.web.test_conversations import csrf_of, send
    loaded = glassbox(chat_app).core.models["chat"]
    holder = loaded.prefix_cache  # built at boot, shared by the executor, the warm-up and Inside
    client = chat_app.test_client()
    first = send(client, "first question", htmx=False, seed="1", max_new_tokens="10")
    cid = first.headers["Location"].rsplit("/", 1)[1]
    head = 1 + len(loaded.prompt.fewshot_ids)  # bos and the few-shot turns, pinned at warm-up
    assert holder.hits == 1 and holder.reused_tokens == head
    first_prompt = loaded.prompt.build([{"role": "user", "content": "first question"}], 10)
    send(client, "second question", csrf_of(client, f"/chat/c/{cid}"), htmx=False, conversation_id=cid,
         seed="1", max_new_tokens="10")
    assert holder.hits == 2 and holder.reused_tokens - head >= len(first_prompt)


def test_the_pinned_head_is_copied_to_every_prompt_and_never_taken():
    """Replies arriving together each start from a copy of the pinned head (bos and the few-shot turns)
    and prefill only their own turns; a conversation's kept cache that shares more is still taken, and
    one that shares only the head is left for its own conversation."""
    loaded = tiny(config=BIG, endless=True)
    head = [(3 * i) % 250 for i in range(40)]
    holder = PrefixCache()
    pin_prompt_head(loaded, head, holder)
    prompts = [head + [7 + i, 8, 9] for i in range(3)]
    assert reply(loaded, prompts[0], holder)[1].reused_tokens == len(head)
    assert len(holder) == 1  # the first reply's own cache, kept; the head stays pinned
    assert reply(loaded, prompts[0], holder)[1].reused_tokens == len(prompts[0]) - 1  # its own kept cache
    assert reply(loaded, prompts[1], holder)[1].reused_tokens == len(head)  # only the head: a copy of it
    assert len(holder) == 2  # the first conversation's cache was not taken for it
    copy = holder.take(prompts[2], torch.device("cpu"), torch.float32, loaded.model)
    assert len(holder) == 2 and copy.ids == head and copy.cache.max_len == BIG.block_size
    kept, _ = holder.peek(prompts[0], loaded.model)  # the first conversation's cache: its head as the copy's, bitwise
    before = [t[:, :, :len(head)].clone() for t in copy.cache.k + copy.cache.v]
    for mine, theirs in zip(before, kept.cache.k + kept.cache.v):
        assert torch.equal(mine, theirs[:, :, :len(head)])
    for t in copy.cache.k + copy.cache.v:
        t.zero_()  # a reply writes its copy: the pinned head stays as it was
    again = holder.take(prompts[2], torch.device("cpu"), torch.float32, loaded.model)
    assert all(torch.equal(a, t[:, :, :len(head)]) for a, t in zip(before, again.cache.k + again.cache.v))
