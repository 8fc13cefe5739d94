import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from webapp.chat.decode.generate import MIN_CHUNK, generate, prefill_chunk
from webapp.chat.model.gpt import GPT, Chunk, GPTConfig
from webapp.chat.model.loading import LoadedChatModel, load_chat_model
from webapp.chat.model.prompt import PromptBuilder
from webapp.chat.model.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[3]
END = 260  # <|assistant_end|> of the byte tokenizer


class Scripted(nn.Module):
    """Emits a fixed token script after the prompt, whatever the input (full-recompute contract)."""

    def __init__(self, script, prompt_len, vocab=264, block_size=64):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size, vocab_size=vocab)
        self.scale = nn.Parameter(torch.ones(()))
        self.script, self.prompt_len, self.vocab = script, prompt_len, vocab

    def forward(self, idx, targets=None):
        logits = torch.zeros(idx.size(0), 1, self.vocab)
        logits[:, :, self.script[idx.size(1) - self.prompt_len]] = 10.0
        return logits * self.scale, None


def loaded_for(model, kv=False, block_size=64):
    tok = ByteTokenizer()
    return LoadedChatModel(model=model, tokenizer=tok, block_size=block_size, supports_kv_cache=kv,
                           checkpoint_id="test", description="test", prompt=PromptBuilder(tok, 2048))


def run(loaded, prompt, **kw):
    kw.setdefault("temperature", 0)
    pieces = list(generate(loaded, prompt, **kw))
    assert pieces[-1].stats is not None and all(p.stats is None for p in pieces[:-1])
    return pieces


def test_multibyte_character_split_across_tokens():
    script = [0x41, 0xC3, 0xA9, 0xE6, 0x9D, 0xB1, 0x21, END]  # "A", "é" in 2 bytes, "東" in 3, "!"
    pieces = run(loaded_for(Scripted(script, 3)), [1, 2, 3])
    assert [p.text for p in pieces] == ["A", "", "é", "", "", "東", "!", ""]
    assert [p.tokens for p in pieces[:-1]] == [1, 2, 3, 4, 5, 6, 7]
    stats = pieces[-1].stats
    assert stats.new_tokens == 7 and stats.stop_reason == "end" and stats.prompt_tokens == 3


def test_invalid_bytes_are_dropped_and_tail_flushed():
    pieces = run(loaded_for(Scripted([0x41, 0xFF, 0x42, 0xC3, END], 1)), [1])
    assert "".join(p.text for p in pieces) == "AB"  # 0xFF never valid, 0xC3 incomplete at the end


def test_a_crlf_split_across_tokens_streams_as_one_line_break():
    cr, lf = 0x0D, 0x0A
    pieces = run(loaded_for(Scripted([0x61, cr, lf, 0x62, cr, 0x63, cr, END], 1)), [1])
    assert [p.text for p in pieces] == ["a", "", "\r\n", "b", "", "\rc", "", "\r"]  # a last \r comes out at the end
    assert "".join(p.text for p in pieces) == "a\r\nb\rc\r"


def test_special_token_stops_without_being_emitted():
    for special in (256, 259, 260, 263):  # any special, or a padding id above them
        pieces = run(loaded_for(Scripted([0x48, 0x69, special, 0x21], 1)), [1])
        assert "".join(p.text for p in pieces) == "Hi"
        assert pieces[-1].stats.new_tokens == 2 and pieces[-1].stats.stop_reason == "end"


def test_max_new_tokens_stops_with_length():
    pieces = run(loaded_for(Scripted([0x61] * 10, 1)), [1], max_new_tokens=4)
    assert "".join(p.text for p in pieces) == "aaaa" and pieces[-1].stats.stop_reason == "length"
    assert pieces[-1].stats.time_to_first_token_s is not None



TINY = GPTConfig(block_size=32, vocab_size=264, n_layer=2, n_head=2, n_embd=16)
NO_SPECIALS = lambda m, a, logits: logits.index_fill_(-1, torch.arange(256, 264), float("-inf"))  # noqa: E731


def tiny(kv=True, config=TINY, endless=False):
    """A random GPT with the byte tokenizer; `endless` masks the specials so it never stops early."""
    torch.manual_seed(3)
    model = GPT(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # larger logits: no near-ties in greedy comparisons
    if endless:
        model.lm_head.register_forward_hook(NO_SPECIALS)
    return LoadedChatModel(model=model, tokenizer=ByteTokenizer(), block_size=config.block_size,
                           supports_kv_cache=kv, checkpoint_id="t", description="t", prompt=None)


def sampled(loaded, prompt, **kw):
    pieces = list(generate(loaded, prompt, **kw))
    return [p.tokens for p in pieces], "".join(p.text for p in pieces), pieces[-1].stats


@pytest.mark.parametrize("kv", [True, False])
def test_a_branchs_rate_counts_only_the_tokens_it_sampled(kv):
    """Given tokens (a branch's kept tokens and typed text) cost no decode step: counting them in
    tokens/s made a branch with typed text report thousands of tokens/s."""
    given = list(b"typed by hand")
    pieces = list(generate(tiny(kv=kv, endless=True), [1, 2], max_new_tokens=20, temperature=0, forced=given))
    stats = pieces[-1].stats
    assert stats.new_tokens == 20 and [p.given for p in pieces if p.token is not None] == [True] * 13 + [False] * 7
    expected = (20 - len(given) - 1) / (stats.total_s - stats.time_to_first_token_s)
    assert stats.decode_tokens_per_s == pytest.approx(expected)
    one = list(generate(tiny(kv=kv, endless=True), [1, 2], max_new_tokens=len(given) + 1, temperature=0,
                        forced=given))
    assert one[-1].stats.decode_tokens_per_s is None  # one sampled token: no rate, as for any one-token reply


def test_seed_reproducible_and_global_rng_untouched():
    loaded, prompt = tiny(), [1, 2, 3, 4]
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = sampled(loaded, prompt, seed=123, max_new_tokens=20, temperature=1.5, top_k=0)
    b = sampled(loaded, prompt, seed=123, max_new_tokens=20, temperature=1.5, top_k=0)
    assert torch.equal(before, torch.get_rng_state())
    assert a[1] == b[1] and a[2].new_tokens == b[2].new_tokens
    others = {sampled(loaded, prompt, seed=s, max_new_tokens=20, temperature=1.5, top_k=0)[1] for s in range(5)}
    assert len(others) > 1


def test_greedy_equals_top_1_and_matches_without_cache():
    prompt = [5, 9, 11]
    greedy = sampled(tiny(), prompt, temperature=0, max_new_tokens=15)
    top1 = sampled(tiny(), prompt, temperature=1.0, top_k=1, seed=1, max_new_tokens=15)
    recompute = sampled(tiny(kv=False), prompt, temperature=0, max_new_tokens=15)
    assert greedy[1] == top1[1] == recompute[1]
    assert greedy[2].kv_cache and not recompute[2].kv_cache


def test_window_slides_past_block_size_like_the_owner_loop():
    # a prompt longer than the window, and a reply that runs past it: both paths crop alike
    prompt = [(7 * i) % 256 for i in range(40)]
    a = sampled(tiny(endless=True), prompt, temperature=0, max_new_tokens=10)
    b = sampled(tiny(kv=False, endless=True), prompt, temperature=0, max_new_tokens=10)
    assert a[1] == b[1] and a[2].new_tokens == 10


def test_top_k_edge_cases():
    loaded, prompt = tiny(), [1, 2]
    for top_k in (0, 1, 263, 264, 10_000):  # whole vocabulary, greedy-like, and more than the vocabulary
        assert sampled(loaded, prompt, top_k=top_k, seed=0, max_new_tokens=5)[2].stop_reason in ("end", "length")
    with pytest.raises(ValueError, match="top_k"):
        generate(loaded, prompt, top_k=-1)
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            generate(loaded, prompt, temperature=bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(loaded, prompt, max_new_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        generate(loaded, [])


def test_should_stop_during_decode_and_prefill(monkeypatch):
    seen = []
    for piece in generate(tiny(endless=True), [1, 2], temperature=0, max_new_tokens=20,
                          should_stop=lambda: len(seen) >= 3):
        seen.append(piece)
    assert seen[-1].stats.stop_reason == "cancelled" and seen[-1].stats.new_tokens == 3

    # a long prompt is prefilled in chunks, with a check before each: a cancel lands mid-prefill
    monkeypatch.setattr("webapp.chat.decode.generate.PREFILL_FLOPS", 0.0)  # every chunk the smallest
    calls = []
    long = tiny(config=dataclasses.replace(TINY, block_size=3 * MIN_CHUNK))
    pieces = list(generate(long, [1] * (3 * MIN_CHUNK - 5),
                           should_stop=lambda: calls.append(1) or len(calls) > 2))
    assert len(calls) == 3 and len(pieces) == 1
    assert pieces[0].stats.new_tokens == 0 and pieces[0].stats.stop_reason == "cancelled"


BUNDLED = ROOT / "models/chat/model.safetensors"


@pytest.mark.skipif(not BUNDLED.is_file(), reason="bundled model not trained yet")
@pytest.mark.parametrize("question, answer", [
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("What is 12 plus 30?", "12 + 30 = 42."),
    ("What is the Loop lab?", "The Loop lab shows a looped transformer following an A-Z pointer table, loop by loop."),
])
def test_bundled_model_answers(bundled, question, answer):
    ids = bundled.prompt.build([{"role": "user", "content": question}], 200)
    assert "".join(p.text for p in generate(bundled, ids, temperature=0)) == answer


@pytest.fixture(scope="module")
def bundled():
    loaded = load_chat_model(str(BUNDLED))
    assert loaded.tokenizer.name == "byte" and loaded.supports_kv_cache
    return loaded


def test_one_host_read_per_token_and_no_retokenizing(monkeypatch):
    """Per token the generator reads one value back from the device (the sampled id: it must know
    whether to stop) and never tokenizes again; everything else stays on the device."""
    loaded = tiny(endless=True)
    reads, encodes = [], []
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k:
                            reads.append(_n) or _o(self, *a, **k))
    monkeypatch.setattr(loaded.tokenizer, "encode_ordinary", lambda text: encodes.append(text) or [])
    pieces = list(generate(loaded, [1, 2, 3], max_new_tokens=10, seed=0))
    assert pieces[-1].stats.new_tokens == 10
    assert reads == ["item"] * 10 and encodes == []


def test_prefill_chunks_depend_on_the_model_alone(monkeypatch):
    """Chunk boundaries change keys and values in the last bits, so they must not depend on timing:
    the same prompt is cut the same way every time, and a bigger model gets smaller chunks."""
    loaded = tiny(config=dataclasses.replace(TINY, block_size=512), endless=True)
    params = sum(p.numel() for p in loaded.model.parameters())
    monkeypatch.setattr("webapp.chat.decode.generate.PREFILL_FLOPS", 2 * params * 64)  # 64-token chunks
    sizes = []
    original = loaded.model.prefill
    monkeypatch.setattr(loaded.model, "prefill",
                        lambda chunks: sizes.extend(len(c.ids) for c in chunks) or original(chunks))
    prompt = [(5 * i) % 256 for i in range(300)]
    first = sampled(loaded, prompt, seed=3, max_new_tokens=5)[:2]
    cut, sizes[:] = list(sizes), []
    assert sampled(loaded, prompt, seed=3, max_new_tokens=5)[:2] == first and sizes == cut
    chunk = prefill_chunk(loaded.model)
    assert MIN_CHUNK <= chunk < 300 and cut == [chunk] * (300 // chunk) + [300 % chunk]
    bigger = tiny(config=dataclasses.replace(TINY, n_layer=8, n_embd=64)).model
    assert prefill_chunk(bigger) < chunk


@torch.inference_mode()
def test_decode_fast_paths_match_the_plain_ones():
    from webapp.chat.model.linear import Linear
    torch.manual_seed(0)
    layer = Linear(16, 8)
    for x in (torch.randn(1, 1, 16), torch.randn(16), torch.randn(1, 16), torch.randn(2, 3, 16)):
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-6)
    model = tiny().model
    idx = torch.randint(0, 256, (1, 12))
    cache = model.new_cache()
    assert model.prefill([Chunk(idx[0, :8].tolist(), cache, 0, logits=False)]) == [None]  # a chunk before the last
    assert torch.allclose(model.prefill([Chunk(idx[0, 8:].tolist(), cache, 8)])[0], model(idx)[0][:, -1], atol=1e-5)


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs 2+ CPUs (one starts no thread pool anyway) and Linux's /proc")
def test_loading_under_one_torch_thread_starts_no_thread_pool():
    """The core's worker must be the only thread with an OpenMP pool, or libgomp's threads sleep
    between operations (docs/benchmarks-history.md, "Fast decoding (#5)": 0.86-0.91 of the speed). Checked
    in a fresh process."""
    code = """if True:
        import os, torch
        from webapp.core.threads import one_torch_thread
        tasks = lambda: len(os.listdir("/proc/self/task"))
        before, threads = tasks(), torch.get_num_threads()
        with one_torch_thread():
            torch.randn(1 << 22).mul_(2)
        assert tasks() == before and torch.get_num_threads() == threads, (tasks(), before)
        torch.randn(1 << 22).mul_(2)  # the same work outside starts a pool: the check can fail
        assert tasks() > before
    """
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
