import random

import pytest
import torch

from webapp.loops.model.loop_state import LoopOutput
from webapp.loops.model.looped import LoopConfig, LoopTransformer, loop_digits
from webapp.loops.model.tokenizer import CharTokenizer
from webapp.loops.task import SYMBOLS, preset, render_prompt

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LoopTransformer(LoopConfig(n_embd=32)).eval()


def encode(k=5, seed=0, start="C"):
    return TOK(render_prompt(preset("function", random.Random(seed)), start, k),
               add_special_tokens=False, return_tensors="pt")


def run(model, num_loops=10, threshold=1.01, callback=None, enc=None):
    enc = enc or encode()
    with torch.inference_mode():
        return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                     num_loops=num_loops, completion_threshold=threshold,
                     readout_token_ids=TOK.readout_token_ids, loop_callback=callback)


def test_tokenizer_call_shape():
    enc = encode()
    assert set(enc) == {"input_ids", "attention_mask"}
    assert enc["input_ids"].shape == enc["attention_mask"].shape == (1, 88)
    assert enc["input_ids"].dtype == enc["attention_mask"].dtype == torch.long
    assert enc["attention_mask"].eq(1).all()
    assert TOK.decode(TOK.readout_token_ids) == SYMBOLS
    assert TOK.decode(enc["input_ids"][0]).endswith(";s=C;k=005;")


def test_batch_encoding_matches_the_call():
    prompts = [render_prompt(preset("permutation", random.Random(s)), "A", s + 1) for s in range(3)]
    assert TOK.encode_batch(prompts).tolist() == [TOK(p)["input_ids"][0].tolist() for p in prompts]
    with pytest.raises(ValueError):
        TOK.encode_batch(["AB", "a?"])


def test_tokenizer_rejects_unknown_characters():
    with pytest.raises(ValueError, match="outside the Loop-lab vocabulary"):
        TOK("AB cd", add_special_tokens=False, return_tensors="pt")


def test_callback_once_per_loop_with_contract_shapes(model):
    calls = []

    def observe(loop, scores, stop_logits, state_logits):
        calls.append((loop, stop_logits.sigmoid().item()))
        assert scores.shape == (1, 26) and scores.dtype == torch.float32
        assert state_logits.shape == (1, 26)

    out = run(model, num_loops=7, callback=observe)
    assert isinstance(out, LoopOutput)
    assert [loop for loop, _ in calls] == list(range(1, 8))         # num_loops caps the run
    assert out.scores.shape == (1, 7, 26) and out.stop_logits.shape == (1, 7)
    assert out.stop_logits[0, -1].sigmoid().item() == pytest.approx(calls[-1][1])
    assert out.halted_at.tolist() == [0]


def test_halts_when_stop_probability_reaches_threshold(model):
    calls = []
    out = run(model, num_loops=50, threshold=0.0, callback=lambda *a: calls.append(a[0]))
    assert calls == [1] and out.stop_logits.shape == (1, 1) and out.halted_at.tolist() == [1]


def test_raising_callback_propagates_and_stops_the_loop(model):
    calls = []

    def observe(loop, *_):
        calls.append(loop)
        if loop == 3:
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt, match="cancelled"):
        run(model, num_loops=20, callback=observe)
    assert calls == [1, 2, 3]


def test_learned_completion_head_and_bad_arguments(model):
    assert isinstance(model.completion_head, torch.nn.Module)
    with pytest.raises(ValueError, match="26 ids"):
        model(input_ids=encode()["input_ids"], readout_token_ids=[0, 1, 2])
    with pytest.raises(ValueError, match="num_loops"):
        run(model, num_loops=0)


def test_loop_digits():
    assert loop_digits(torch.tensor([7, 45, 256])).tolist() == [[0, 0, 7], [0, 4, 5], [2, 5, 6]]


def test_inference_feeds_back_its_own_argmax(model):
    # The same block, given the model's own previous predictions all at once,
    # reproduces the inference loop: nothing but the letter is carried.
    enc = encode(k=9)
    with torch.inference_mode():
        out = run(model, num_loops=9, enc=enc)
        own = torch.cat([out.start_scores.argmax(-1, keepdim=True), out.scores[:, :-1].argmax(-1)], 1)
        teacher = model.teacher_forward(enc["input_ids"], own, torch.arange(1, 10),
                                        readout_token_ids=TOK.readout_token_ids)
    torch.testing.assert_close(teacher["scores"], out.scores)
    torch.testing.assert_close(teacher["stop_logits"], out.stop_logits)


def test_batch_matches_batch_of_one(model):
    encs = [encode(k=k, seed=k, start=s) for k, s in ((3, "A"), (12, "Q"), (30, "Z"))]
    ids = torch.cat([e["input_ids"] for e in encs])
    with torch.inference_mode():
        batch = model(input_ids=ids, num_loops=12, completion_threshold=1.01,
                      readout_token_ids=TOK.readout_token_ids)
    for b, enc in enumerate(encs):
        single = run(model, num_loops=12, enc=enc)
        torch.testing.assert_close(batch.scores[b], single.scores[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch.stop_logits[b], single.stop_logits[0], atol=1e-5, rtol=1e-5)


def run_with_attention(model, num_loops=10, enc=None):
    calls = []

    def observe(loop, scores, stop_logits, state_logits, attention):
        calls.append((scores.clone(), stop_logits.clone(), attention.clone()))

    enc = enc or encode()
    with torch.inference_mode():
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], num_loops=num_loops,
                    completion_threshold=1.01, readout_token_ids=TOK.readout_token_ids,
                    loop_callback=observe, loop_attention=True)
    return out, calls


def test_loop_attention_is_a_distribution_over_the_prompt_per_head(model):
    out, calls = run_with_attention(model, num_loops=6)
    assert len(calls) == 6
    for _, _, attention in calls:
        assert attention.shape == (1, model.config.n_head, 88)
        assert (attention >= 0).all()
        torch.testing.assert_close(attention.sum(-1), torch.ones(1, model.config.n_head))


def test_loop_attention_is_the_weights_the_block_uses(model):
    # A plain reference: the weights times the values, through the output projection, give the
    # fused attention's own output.
    enc = encode()
    with torch.inference_mode():
        kv, mask, _ = model.encode(enc["input_ids"], enc["attention_mask"])
        z = model.wte(torch.tensor([[2]]))                                  # the letter C
        block = model.loop_block
        weights = block.attention(z, kv, mask)                              # [1, nh, 1, T]
        y = (weights @ kv[1]).transpose(1, 2).reshape(1, 1, -1)
        torch.testing.assert_close(block.attn.c_proj(y), block.attn(block.ln_1(z), kv, mask),
                                   atol=1e-5, rtol=1e-5)


def test_capturing_attention_leaves_every_output_bit_for_bit_unchanged(model):
    plain_calls = []
    plain = run(model, num_loops=20, callback=lambda loop, s, stop, state: plain_calls.append(
        (s.clone(), stop.clone())))
    captured, calls = run_with_attention(model, num_loops=20)
    for key in ("scores", "stop_logits", "state_logits", "halted_at", "start_scores"):
        assert torch.equal(getattr(plain, key), getattr(captured, key)), key
    assert len(plain_calls) == len(calls)
    for (s, stop), (s2, stop2, _) in zip(plain_calls, calls):
        assert torch.equal(s, s2) and torch.equal(stop, stop2)
