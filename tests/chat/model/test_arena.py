"""Weights in huge pages (webapp/chat/model/arena.py): the same bits in one mapping, tied weights still tied,
the same logits at every precision, and huge pages where the system gives them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from webapp.chat.model.arena import HUGE_PAGE, MIN_BYTES, into_huge_pages
from webapp.chat.model.gpt import GPT, Chunk, GPTConfig
from webapp.chat.model.precision import apply_precision

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=2, n_head=4, n_embd=128)).eval()


def large_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in (*model.parameters(), *model.buffers()) if t.nbytes >= MIN_BYTES]


def test_large_weights_move_into_one_aligned_mapping_with_the_same_bits_and_ties_kept():
    model = small_gpt()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    old = {t.data_ptr() for t in large_tensors(model)}
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as nanoGPT ties them
    into_huge_pages(model)
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert model.lm_head.weight is model.transformer.wte.weight
    moved = sorted(t.data_ptr() for t in large_tensors(model))
    assert moved and not old & set(moved)  # every large tensor moved...
    assert moved[0] % HUGE_PAGE == 0 and all(p % 4096 == 0 for p in moved)  # ...onto pages of its own
    assert moved[-1] - moved[0] < 2 * sum(t.nbytes for t in large_tensors(model))  # one block
    small = model.transformer.h[0].ln_1.weight
    assert small.nbytes < MIN_BYTES and small.data_ptr() not in moved  # left where it was


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_a_model_in_huge_pages_gives_the_same_logits_prefill_and_decode(precision):
    plain = apply_precision(small_gpt(), precision)  # apply_precision moves the weights: copy them back out
    plain._apply(lambda t: t.clone())
    huge = apply_precision(small_gpt(), precision)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(large_tensors(plain), large_tensors(huge)))
    ids = [3, 14, 15, 92, 65, 35, 89, 79]
    outputs = []
    with torch.inference_mode():
        for model in (plain, huge):
            cache = model.new_cache()
            first = model.prefill([Chunk(ids, cache)])[0]  # one chunk: its logits
            steps = [model.decode_step(torch.tensor([[t]]), [cache], [len(ids) + i]) for i, t in enumerate(ids[:4])]
            outputs.append((first, steps))
    (first_a, steps_a), (first_b, steps_b) = outputs
    assert torch.equal(first_a, first_b)
    assert all(torch.equal(a, b) for a, b in zip(steps_a, steps_b))


def test_the_weights_are_in_huge_pages_where_the_system_gives_them():
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("transparent huge pages are off on this system: the weights stay in 4 KiB pages")
    model = into_huge_pages(GPT(GPTConfig(block_size=64, vocab_size=4096, n_layer=2, n_head=4, n_embd=512)))
    start = min(t.data_ptr() for t in large_tensors(model))
    for block in _mappings():
        low, high = block["range"]
        if low <= start < high:
            assert block.get("AnonHugePages", 0) >= HUGE_PAGE // 1024, block
            return
    pytest.fail("the arena's mapping is not in /proc/self/smaps")


def _mappings() -> list[dict]:
    """/proc/self/smaps as one dict per mapping: its address range and its sizes in kB."""
    found: list[dict] = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(part, 16) for part in head.split("-"))
            found.append({"range": (low, high)})
        elif head.endswith(":") and len(line.split()) == 3 and found:
            found[-1][head[:-1]] = int(line.split()[1])
    return found


def test_a_copy_of_a_model_in_huge_pages_is_a_copy():
    model = into_huge_pages(small_gpt())
    twin = copy.deepcopy(model)
    assert twin.lm_head.weight.data_ptr() != model.lm_head.weight.data_ptr()
    twin.lm_head.weight.data.zero_()
    assert model.lm_head.weight.abs().sum() > 0
