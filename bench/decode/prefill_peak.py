"""The app's prefill against the arithmetic peak of its precision (issue 53), and what bfloat16 prefill costs in
accuracy.

    .venv/bin/python -m bench.decode.prefill_peak                       # gpt2-254m, a 930-token context, 2 threads
    .venv/bin/python -m bench.decode.prefill_peak --prompt 512 --reps 2 --no-doc   # a quick look

Speed: one cold prefill of the context through the app's prefill (GPT.prefill, every position's keys and values
and the last position's logits), float32 and bfloat16 interleaved, best of --reps. Its work is counted as
multiply-adds: every linear layer once per token (12 C² a block), lm_head once, and causal attention's useful
half (queries × keys and weights × values: C·T(T+1) a block). The peak is bench/decode/op_peak.c's, measured in
the same run: one core's fused multiply-adds in registers, for float32 the wider of AVX2 and AVX-512, for bfloat16
vdpbf16ps where the CPU has it (oneDNN's bfloat16 inner product runs it there; without it bfloat16 prefill widens
its weights and float32's peak is its own), times the threads.

Accuracy: the bundled chat model (models/chat) over held-out exchanges (scripts/chat_corpus.py held_out, in the
model's own prompt template), every position's next-token distribution in float32 against bfloat16: the share
of positions whose top token is the same, the mean KL divergence, and the cross-entropy of the text under each.
The same on the random 254M weights, whose distributions say nothing of language but everything of the rounding.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from bench import common
from bench.decode.op_peak import HARNESS, run
from webapp.chat.model.gpt import PRESETS, Chunk, GPTConfig
from webapp.chat.model.precision import apply_precision
from webapp.nn.rowwise import onednn_bfloat16

PRECISIONS = ("float32", "bfloat16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m", choices=sorted(PRESETS))
    p.add_argument("--prompt", type=int, default=930, help="context length in tokens")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def multiply_adds(config: GPTConfig, tokens: int) -> float:
    """A prefill's useful multiply-adds: the linear layers per token, lm_head for the last, causal attention."""
    c = config.n_embd
    return config.n_layer * (12 * c * c * tokens + c * tokens * (tokens + 1)) + config.vocab_size * c


def peaks(threads: int) -> dict[str, float]:
    """{precision: multiply-adds a second at `threads` cores} from op_peak's harness."""
    with common.native_harness(HARNESS, "-O2") as binary:
        rates = run(binary, 20_000_000)
    float32 = max(rates.get("float32", 0.0), rates.get("float32-avx512", 0.0))
    bfloat16 = rates["bfloat16-dpbf16"] if onednn_bfloat16() and "bfloat16-dpbf16" in rates else float32
    return {"float32": threads * float32 * 1e9, "bfloat16": threads * bfloat16 * 1e9}


def prefill_seconds(model, ids: list[int]) -> float:
    cache = model.new_cache(1, len(ids))
    t = time.perf_counter()
    model.prefill([Chunk(ids, cache, 0, logits=True)])
    return time.perf_counter() - t


def held_out_windows(loaded, windows: int) -> list[list[int]]:
    """Held-out exchanges in the model's prompt template, cut into windows of its block size."""
    sys.path.insert(0, str(common.ROOT / "scripts"))
    from chat_corpus import held_out
    ids: list[int] = []
    for qa in held_out():
        ids += loaded.prompt.encode_turn("user", qa.question) + loaded.prompt.encode_turn("assistant", qa.answer)
    size = loaded.block_size
    return [ids[i:i + size] for i in range(0, min(len(ids), windows * size) - size + 1, size)]


def agreement(reference, other, windows: list[list[int]]) -> tuple[float, float, float, float]:
    """-> (share of positions with the same top token, mean KL(reference ‖ other) in nats, the text's
    cross-entropy under each)."""
    same = kl = ce_ref = ce_other = n = 0.0
    for ids in windows:
        x = torch.tensor([ids[:-1]])
        y = torch.tensor([ids[1:]])
        ref, _ = reference(x, targets=y)
        out, _ = other(x, targets=y)
        ref_log, out_log = F.log_softmax(ref[0].float(), -1), F.log_softmax(out[0].float(), -1)
        same += (ref_log.argmax(-1) == out_log.argmax(-1)).sum().item()
        kl += (ref_log.exp() * (ref_log - out_log)).sum().item()
        ce_ref -= ref_log.gather(-1, y[0, :, None]).sum().item()
        ce_other -= out_log.gather(-1, y[0, :, None]).sum().item()
        n += len(ids) - 1
    return same / n, kl / n, ce_ref / n, ce_other / n


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = common.load_average()
    torch.set_num_threads(args.threads)
    peak = peaks(args.threads)
    models = {p: apply_precision(common.random_gpt(args.size), p) for p in PRECISIONS}
    ids = common.prompt_ids(args.prompt)
    seconds: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    with torch.inference_mode():
        for p in PRECISIONS:  # warm each path (allocator, oneDNN's primitive cache)
            prefill_seconds(models[p], ids)
        for rep in range(args.reps):
            for p in PRECISIONS:
                seconds[p].append(prefill_seconds(models[p], ids))
            print(f"rep {rep}: " + ", ".join(f"{p} {seconds[p][-1]:.3f} s" for p in PRECISIONS), flush=True)
        work = multiply_adds(PRESETS[args.size], args.prompt)
        rows = []
        for p in PRECISIONS:
            best = min(seconds[p])
            rate = work / best
            rows.append([p, f"{best:.3f}", f"{args.prompt / best:.0f}", f"{rate / 1e9:.1f}",
                         f"{peak[p] / 1e9:.1f}", f"{rate / peak[p]:.2f}"])
        from webapp.chat.model.loading import load_chat_model
        bundled = {p: load_chat_model(str(common.ROOT / "models/chat/model.safetensors"), dtype=p)
                   for p in PRECISIONS}
        windows = held_out_windows(bundled["float32"], 8)
        small = agreement(bundled["float32"].model, bundled["bfloat16"].model, windows)
        random_ids = [common.prompt_ids(args.prompt)[:512]]
        large = agreement(models["float32"], models["bfloat16"], random_ids)
    body = (common.table(["precision", "prefill s (best)", "tokens/s", "GMAC/s", "peak GMAC/s", "of peak"], rows)
            + f"\n\n- {args.size}, random GPT-2-init weights, a {args.prompt}-token context prefilled cold in one "
            f"chunk, {args.threads} threads, best of {args.reps}; {work / 1e9:.1f} G multiply-adds a prefill "
            "(linear layers, lm_head once, causal attention's useful half). Peak: bench/decode/op_peak.c in this run "
            f"(float32 {peak['float32'] / args.threads / 1e9:.1f}, bfloat16 {peak['bfloat16'] / args.threads / 1e9:.1f}"
            f" GMAC/s a core{', vdpbf16ps' if onednn_bfloat16() else ', no bfloat16 inner product: widened'}).\n"
            + "\nbfloat16 prefill against float32, every position's next-token distribution:\n\n"
            + common.table(["model, text", "same top token", "mean KL (nats)", "cross-entropy float32",
                            "cross-entropy bfloat16"],
                           [[f"bundled chat model, {sum(len(w) - 1 for w in windows):,} held-out positions",
                             f"{small[0]:.4f}", f"{small[1]:.2e}", f"{small[2]:.4f}", f"{small[3]:.4f}"],
                            [f"{args.size} random weights, 511 positions", f"{large[0]:.4f}", f"{large[1]:.2e}",
                             f"{large[2]:.3f}", f"{large[3]:.3f}"]]))
    common.report(f"bench.decode.prefill_peak: {args.size}, the prefill against its precision's peak", body,
                  load_before=load_before, write_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
