import pytest
import torch

from webapp.chat.model.gpt import GPT, PRESETS, Chunk, GPTConfig

SMALL = GPTConfig(block_size=32, vocab_size=70, n_layer=2, n_head=2, n_embd=16)


def small_model(seed=0, config=SMALL):
    torch.manual_seed(seed)
    return GPT(config).eval()


def prefill(model, idx, cache, start, logits=True):
    """One sequence's chunk idx (1, T) at positions start.. -> its last position's logits (1, V) or None."""
    return model.prefill([Chunk(idx[0].tolist(), cache, start, logits)])[0]


def test_nanogpt_parameter_layout():
    keys = set(small_model().state_dict())
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                "transformer.ln_f.bias", "lm_head.weight"}
    for i in range(2):
        for name in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            expected |= {f"transformer.h.{i}.{name}.weight", f"transformer.h.{i}.{name}.bias"}
    assert keys == expected
    m = small_model()
    assert m.lm_head.weight is m.transformer.wte.weight  # tied
    no_bias = GPT(GPTConfig(block_size=8, vocab_size=10, n_layer=1, n_head=1, n_embd=8, bias=False))
    assert not any(k.endswith(".bias") for k in no_bias.state_dict())


def test_presets():
    assert PRESETS["gpt2-254m"] == GPTConfig(block_size=1024, vocab_size=50304, n_layer=16, n_head=16, n_embd=1024)
    with torch.device("meta"):  # count without allocating a gigabyte
        assert 250e6 < GPT(PRESETS["gpt2-254m"]).num_params() < 258e6
        assert 123e6 < GPT(PRESETS["gpt2"]).num_params() < 125e6


def test_forward_contract():
    m = small_model()
    idx = torch.randint(0, 70, (3, 10))
    logits, loss = m(idx)
    assert logits.shape == (3, 1, 70) and loss is None  # last position only without targets
    logits, loss = m(idx, idx)
    assert logits.shape == (3, 10, 70) and loss.ndim == 0
    targets = torch.full((3, 10), -1)
    targets[:, -1] = 5
    _, masked = m(idx, targets)  # -1 = no loss there
    assert torch.isfinite(masked)
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, 33, dtype=torch.long))


@torch.inference_mode()
def test_kv_cache_matches_full_forward():
    m = small_model()
    idx = torch.randint(0, 70, (1, 20))
    full = [m(idx[:, :t + 1])[0][:, -1] for t in range(20)]  # last-position logits of every prefix

    cache = m.new_cache()
    assert len(cache.k) == len(cache.v) == 2 and cache.k[0].shape == (1, 2, 32, 8)  # per layer (B, nh, T, hs)
    assert torch.allclose(prefill(m, idx, cache, 0), full[-1], atol=1e-5)  # one prefill

    cache = m.new_cache()  # chunked prefill (5 + 5) then one token at a time
    prefill(m, idx[:, :5], cache, 0)
    assert torch.allclose(prefill(m, idx[:, 5:10], cache, 5), full[9], atol=1e-5)
    for t in range(10, 20):
        assert torch.allclose(prefill(m, idx[:, t:t + 1], cache, t), full[t], atol=1e-5)


@torch.inference_mode()
def test_two_sequences_prefill_together_each_in_its_own_cache():
    m = small_model()
    idx = torch.randint(0, 70, (2, 12))
    caches = [m.new_cache(), m.new_cache()]
    m.prefill([Chunk(idx[row, :11].tolist(), caches[row], 0, logits=False) for row in range(2)])
    both = m.prefill([Chunk(idx[row, 11:].tolist(), caches[row], 11) for row in range(2)])
    for row in range(2):
        assert torch.allclose(both[row][0], m(idx[row:row + 1])[0][0, -1], atol=1e-5)


def test_kv_cache_bounds():
    m = small_model()
    cache = m.new_cache(max_len=8)
    with torch.inference_mode(), pytest.raises(ValueError, match="KV cache"):
        prefill(m, torch.zeros(1, 9, dtype=torch.long), cache, 0)


@torch.inference_mode()
@pytest.mark.parametrize("n_embd", [16, 64])
def test_prefill_gives_each_of_several_chunks_the_bits_it_gets_alone(n_embd):
    """Several sequences' prefill chunks side by side in one pass (a first chunk, a later chunk with its
    cache already holding the earlier ones, one without logits): every cache and every logit is the same,
    bit for bit, as prefill on that chunk alone."""
    config = GPTConfig(block_size=96, vocab_size=70, n_layer=2, n_head=2, n_embd=n_embd)
    model = small_model(config=config)
    assert model.prefills_together()
    prompts = [[(5 * j + i) % 70 for j in range(n)] for i, n in enumerate([7, 40, 1, 23])]
    starts = [0, 17, 0, 9]  # where each chunk begins: the rest of the prompt before it is already cached
    wants = [True, True, True, False]
    alone, together = [], []
    for prompt, start, want in zip(prompts, starts, wants):
        caches = []
        for _ in range(2):
            cache = model.new_cache(1, 96)
            if start:
                prefill(model, torch.tensor([prompt[:start]]), cache, 0, logits=False)
            caches.append(cache)
        alone.append((prefill(model, torch.tensor([prompt[start:]]), caches[0], start, logits=want), caches[0]))
        together.append(caches[1])
    logits = model.prefill([Chunk(p[s:], c, s, w) for p, s, w, c in zip(prompts, starts, wants, together)])
    for (want_logits, want_cache), got, cache, n in zip(alone, logits, together, map(len, prompts)):
        assert (got is None) == (want_logits is None)
        if got is not None:
            assert torch.equal(got, want_logits)
        for layer in range(config.n_layer):
            assert torch.equal(cache.k[layer][:, :, :n], want_cache.k[layer][:, :, :n])
            assert torch.equal(cache.v[layer][:, :, :n], want_cache.v[layer][:, :, :n])


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_only_float32_prefills_together(precision):
    """bfloat16 and int8 prefill kernels sum a row differently with the number of rows: those chunks run alone."""
    from webapp.chat.model.precision import apply_precision
    assert not apply_precision(small_model(config=GPTConfig(block_size=32, vocab_size=70, n_layer=1, n_head=2,
                                                             n_embd=32)), precision).prefills_together()
