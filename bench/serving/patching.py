"""Activation patching between two prompts: the full map (residual (n_layer + 1) x T cells, n_layer x n_head
head cells) for a T-token context on the 254M model (random weights), as a patching job on the shared core
(time to the first published cells, and to the whole map), side by side with a plain PyTorch forward-hook
baseline (one whole forward per cell, as notebooks do it) and, when a TransformerLens environment is there,
TransformerLens' TransformerBridge on the HF export of the same weights (bench/serving/patching_tl.py).

    .venv/bin/python -m bench.serving.patching                       # 254M, T = 32, first change at 8
    .venv/bin/python -m bench.serving.patching --first 0             # every cell needs a forward
    .venv/bin/python -m bench.serving.patching --size gpt2 --no-doc  # quicker
    .venv/bin/python -m bench.serving.patching --tl .bench-tl/bin/python   # + TransformerLens 4.3
    .venv/bin/python -m bench.serving.patching --nnsight .bench-nnsight/bin/python   # + nnsight (its own venv)
    .venv/bin/python -m bench.serving.patching --bundled             # the bundled model, a 690-character message
    .venv/bin/python -m bench.serving.patching --bundled --question "What is the capital of France?" \
        --edited "What is the capital of Greece?" --reply 25            # the token that names the capital
    .venv/bin/python -m bench.serving.patching --context 930 --first 0 --estimate-only   # the estimate alone

The clean context is random GPT-2 ids; the corrupted one changes the tokens at positions first..first+2.
With --bundled: the bundled chat model's prompt for a 690-character message (bench/robustness/patching_flood.py's)
and its greedy reply, the corrupted one with one letter of the message changed; the metric at the context's
last position: the clean run's choice there against the corrupted run's. Every tool's cells are checked
against Glassbox's (largest difference of the normalised values). The
job's first-order estimate (attribution patching) is timed to its event, against one plain forward of the
context, and compared with the exact map (Pearson's r and the mean |error| over the cells a patched run
works out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--first", type=int, default=8, help="the first position where the contexts differ")
    p.add_argument("--tl", default="", help="a Python with transformer_lens 4.3 (its own venv)")
    p.add_argument("--nnsight", default="", help="a Python with nnsight (its own venv)")
    p.add_argument("--nnsight-batch", type=int, default=8, help="nnsight's patched invokes to a trace (one batch)")
    p.add_argument("--skip-hooks", action="store_true", help="skip the one-forward-per-cell baseline")
    p.add_argument("--sample", type=int, default=0,
                   help="time only this many of the baselines' cells (spread over the map) and scale to all")
    p.add_argument("--estimate-only", action="store_true",
                   help="time the estimated map alone (a JSON request's \"estimate\": true) against one forward")
    p.add_argument("--bundled", action="store_true", help="the bundled chat model after a 690-character message")
    p.add_argument("--reply", type=int, default=40, help="with --bundled: the greedy reply's tokens in the context")
    p.add_argument("--question", default="", help="with --bundled: the message (default: the 690-character one)")
    p.add_argument("--edited", default="", help="with --bundled: the corrupted message (default: one letter changed)")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def contexts(T: int, first: int) -> tuple[list[int], list[int]]:
    clean = common.prompt_ids(T, seed=3)
    corrupted = list(clean)
    for p in range(first, min(T, first + 3)):
        corrupted[p] = (clean[p] + 1000) % common.VOCAB
    return clean, corrupted


def glassbox(loaded, clean, corrupted, chosen, against, estimate_only: bool = False) -> dict:
    """The patching job on the core, as the page runs it: seconds to the estimate, the first exact cells and
    the end (with `estimate_only`, a job for the estimate alone: its end)."""
    from webapp.chat.patching.jobs import PatchingJobs, PatchingRequest
    from webapp.core import InferenceCore, Job
    core = InferenceCore({"chat": loaded}, {"patching": PatchingJobs(loaded)})
    try:
        started = time.perf_counter()
        request = PatchingRequest(tuple(clean), tuple(corrupted), chosen, against, 0, estimate=estimate_only)
        job = core.submit(Job("patching", "bench", request))
        first_cells = estimated = None
        for event in job.subscribe():
            if event is not None and event.name == "estimate":
                estimated = time.perf_counter() - started
            if event is not None and event.name == "cells" and first_cells is None:
                first_cells = time.perf_counter() - started
        total = time.perf_counter() - started
    finally:
        core.shutdown()
    assert job.state == "done", job.error
    p = job.result.patching
    return {"first": first_cells, "total": total, "residual": p.residual, "heads": p.heads,
            "clean": p.clean, "corrupted": p.corrupted, "estimated": estimated, "estimate": p.estimate}


@torch.inference_mode()
def plain_forward(model, ids: list[int], repeats: int = 3) -> float:
    """Seconds for one plain PyTorch forward of the context (nanoGPT's model(idx)), the median of a few."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(torch.tensor([ids]))
        times.append(time.perf_counter() - t0)
    return common.median(times)


def agreement(exact: dict, first: int) -> tuple[float, float, int]:
    """(Pearson's r, mean |exact - estimate|, cells) over the cells a patched run works out."""
    guess = exact["estimate"]
    pairs = [(row[p], guess.residual[layer][p]) for layer, row in enumerate(exact["residual"][:-1])
             for p in range(first, len(row))]
    pairs += [(v, guess.heads[layer][h]) for layer, row in enumerate(exact["heads"]) for h, v in enumerate(row)]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    xs, ys = torch.tensor([x for x, _ in pairs]), torch.tensor([y for _, y in pairs])
    r = float(torch.corrcoef(torch.stack([xs, ys]))[0, 1])
    return r, float((xs - ys).abs().mean()), len(pairs)


def bundled_contexts(reply_tokens: int, question: str = "", edited: str = ""):
    """The bundled chat model, and the clean and corrupted contexts: the prompt for `question` (the flood's
    690-character message) and the first `reply_tokens` of its greedy reply; the same with the message
    `edited` (one letter changed, keeping its length in tokens)."""
    from bench.robustness.patching_flood import LONG
    from webapp.chat.model.loading import load_chat_model
    from webapp.config import Settings
    loaded = load_chat_model(Settings().chat_checkpoint)
    question = question or LONG
    prompt = loaded.prompt.build([{"role": "user", "content": question}], reply_tokens + 1)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(reply_tokens):
            logits, _ = loaded.model(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
    edits = [edited] if edited else [question[:at] + ("e" if question[at] != "e" else "a") + question[at + 1:]
                                     for at in range(len(question) // 2, len(question)) if question[at].isalpha()]
    for other_message in edits:
        other = loaded.prompt.build([{"role": "user", "content": other_message}], reply_tokens + 1)
        if len(other) == len(prompt) and other != prompt:
            return loaded, ids, other + ids[len(prompt):]
    raise RuntimeError("the edited message must keep the message's length in tokens, and change it")


def whole_forward(model, ids: list[int], resid=None, head=None, kept: dict | None = None) -> float:
    """One whole forward of nanoGPT's math through the model's own modules, as a notebook writes it (the model's
    blocks are not modules one can hook: GPT.forward is Glassbox's hooked run), with one activation put in:
    resid (layer, position, vector) in place of the stream entering block `layer` (n_layer: the final one),
    head (layer, head, (T, hs) outputs) in place of a head's output. `kept`: fill it with the run's residuals
    and heads' outputs. -> logit(chosen) - logit(against) is the caller's; this returns the last logits."""
    c = model.config
    T = len(ids)
    x = model.transformer.wte(torch.tensor([ids])) + model.transformer.wpe(torch.arange(T))  # (1, T, C)
    for layer, block in enumerate([*model.transformer.h, None]):
        if resid is not None and resid[0] == layer:
            x = x.clone()
            x[0, resid[1]] = resid[2]
        if kept is not None:
            kept[("r", layer)] = x[0].clone()
        if block is None:
            break
        qkv = block.attn.c_attn(block.ln_1(x)).split(c.n_embd, 2)
        q, k, v = (t.view(1, T, c.n_head, -1).transpose(1, 2) for t in qkv)  # (1, nh, T, hs) each
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, nh, T, hs)
        if head is not None and head[0] == layer:
            y = y.clone()
            y[0, head[1]] = head[2]
        if kept is not None:
            kept[("h", layer)] = y[0].clone()
        x = x + block.attn.c_proj(y.transpose(1, 2).reshape(1, T, c.n_embd))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.transformer.ln_f(x[0, -1]))


@torch.inference_mode()
def hooks(model, clean, corrupted, chosen, against, sample: int = 0) -> dict:
    """One whole forward per cell (whole_forward), the clean activation put in where the cell says.
    sample: only every k-th cell is run (None in the map), and the time of the runs scaled to all cells."""
    c = model.config
    started = time.perf_counter()

    def run(ids, **put):
        logits = whole_forward(model, ids, **put)
        return float(logits[chosen] - logits[against])

    kept: dict = {}
    m_clean = run(clean, kept=kept)
    m_corrupted = run(corrupted)
    span = m_clean - m_corrupted
    first, n, ran, spent = None, 0, 0, 0.0
    T = len(clean)
    cells = (c.n_layer + 1) * T + c.n_layer * c.n_head
    every = max(1, cells // sample) if sample else 1
    setup = time.perf_counter() - started

    def patched(**put):
        nonlocal first, n, ran, spent
        n += 1
        if (n - 1) % every:
            return None
        t0 = time.perf_counter()
        value = (run(corrupted, **put) - m_corrupted) / span
        first = first or time.perf_counter() - started
        ran, spent = ran + 1, spent + time.perf_counter() - t0
        return value

    residual = [[patched(resid=(i, p, kept[("r", i)][p])) for p in range(T)] for i in range(c.n_layer + 1)]
    heads = [[patched(head=(i, h, kept[("h", i)][h])) for h in range(c.n_head)] for i in range(c.n_layer)]
    return {"first": first, "total": setup + spent * cells / ran, "residual": residual, "heads": heads,
            "clean": m_clean, "corrupted": m_corrupted, "ran": ran}


def transformer_lens(python: str, model, clean, corrupted, chosen, against, sample: int = 0) -> dict:
    """bench/serving/patching_tl.py in the TransformerLens environment, on the HF export of the weights."""
    return peer(python, "patching_tl.py", model, clean, corrupted, chosen, against, {"sample": sample})


def nnsight(python: str, model, clean, corrupted, chosen, against, sample: int = 0, batch: int = 8) -> dict:
    """bench/serving/patching_nnsight.py in nnsight's environment, on the HF export of the weights."""
    return peer(python, "patching_nnsight.py", model, clean, corrupted, chosen, against,
                {"sample": sample, "batch": batch})


def peer(python: str, script: str, model, clean, corrupted, chosen, against, more: dict) -> dict:
    """Another library's patching map (its script in its own Python) of the same weights, exported as HF's GPT-2."""
    from webapp.chat.model.hf import export_hf
    with tempfile.TemporaryDirectory() as folder:
        export_hf(common.loaded(model, common.gpt2_tokenizer()), Path(folder) / "hf")
        spec = json.dumps({"hf": str(Path(folder) / "hf"), "clean": clean, "corrupted": corrupted,
                           "chosen": chosen, "against": against, "threads": torch.get_num_threads(), **more})
        out = subprocess.run([python, str(Path(__file__).with_name(script))], input=spec,
                             capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def largest_difference(a: dict, b: dict) -> float:
    pairs = [(x, y) for ra, rb in zip(a["residual"] + a["heads"], b["residual"] + b["heads"]) for x, y in zip(ra, rb)]
    return max(abs(x - y) for x, y in pairs if x is not None and y is not None)


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    if args.bundled:
        loaded, clean, corrupted = bundled_contexts(args.reply, args.question, args.edited)
        model, args.size, args.context, args.skip_hooks = loaded.model, "the bundled chat model", len(clean), True
        args.first = next(p for p, (a, b) in enumerate(zip(clean, corrupted)) if a != b)
    else:
        model = common.random_gpt(args.size)
        loaded = common.loaded(model)
        clean, corrupted = contexts(args.context, args.first)
    with torch.inference_mode():
        logits, _ = model(torch.tensor([clean, corrupted]))
    # the metric: the clean run's first choice against the corrupted run's (its own second where they agree)
    top = logits[0, -1].topk(2).indices.tolist()
    chosen, against = top[0], int(logits[1, -1].argmax())
    if against == chosen:
        against = top[1]
    c = model.config
    cells = (c.n_layer + 1) * args.context + c.n_layer * c.n_head
    if args.estimate_only:
        return estimate_only(args, model, loaded, clean, corrupted, chosen, against, load_before)
    results = {"Glassbox (patching job on the core)": glassbox(loaded, clean, corrupted, chosen, against)}
    if not args.skip_hooks:
        results["plain PyTorch, one whole forward per cell"] = hooks(model, clean, corrupted, chosen, against,
                                                                     args.sample)
    if args.tl:
        try:
            results["TransformerLens 4.3 TransformerBridge"] = transformer_lens(args.tl, model, clean, corrupted,
                                                                                chosen, against, args.sample)
        except RuntimeError as error:
            print(f"TransformerLens could not run: {error}")
    if args.nnsight:
        try:
            results[f"nnsight, {args.nnsight_batch} patched invokes to a trace"] = nnsight(
                args.nnsight, model, clean, corrupted, chosen, against, args.sample, args.nnsight_batch)
        except RuntimeError as error:
            print(f"nnsight could not run: {error}")
    ours = results["Glassbox (patching job on the core)"]
    forward = plain_forward(model, clean)
    r, error, compared = agreement(ours, args.first)
    rows = [[name + (f" ({r['ran']} cells run, time scaled)" if r.get("ran", cells) < cells else ""),
             f"{r['estimated']:.2f}" if r.get("estimated") else "–",
             f"{r['first']:.2f}", f"{r['total']:.2f}", f"{r['total'] / ours['total']:.2f}",
             f"{largest_difference(r, ours):.1e}"] for name, r in results.items()]
    body = (f"{args.size}, T = {args.context}, contexts differ from position {args.first}: {cells} cells "
            f"({c.n_layer + 1} x {args.context} residual, {c.n_layer} x {c.n_head} heads); "
            f"clean {ours['clean']:.3f}, corrupted {ours['corrupted']:.3f}\n\n"
            + common.table(["", "estimate s", "first exact cells s", "all cells s", "x Glassbox's time",
                            "max |Δ| vs Glassbox"], rows)
            + f"\n\nOne plain PyTorch forward of the context: {forward:.3f} s; the estimated map arrived after "
            f"{ours['estimated'] / forward:.2f} of them. Estimate against the exact map, over the {compared} cells "
            f"a patched run works out: Pearson's r = {r:.3f}, mean |error| = {error:.3f}.")
    common.report("Activation patching, full map", body, load_before=load_before, write_doc=not args.no_doc)


def estimate_only(args, model, loaded, clean, corrupted, chosen, against, load_before: str) -> None:
    """The estimated map alone, three jobs on one core (the first warms its worker up), against one plain
    forward of the context."""
    from webapp.chat.patching.jobs import PatchingJobs, PatchingRequest
    from webapp.core import InferenceCore, Job
    forward = plain_forward(model, clean)
    core = InferenceCore({"chat": loaded}, {"patching": PatchingJobs(loaded)})
    times = []
    try:
        for run in range(3):
            started = time.perf_counter()
            job = core.submit(Job("patching", "bench", PatchingRequest(tuple(clean), tuple(corrupted), chosen,
                                                                       against, run, estimate=True)))
            for _ in job.subscribe():
                pass
            assert job.state == "done", job.error
            times.append(time.perf_counter() - started)
    finally:
        core.shutdown()
    spent = common.median(times[1:])
    body = (f"{args.size}, T = {args.context}, contexts differ from position {args.first}: the estimated map "
            f"(a job for the estimate alone) {spent:.3f} s (runs: {', '.join(f'{t:.3f}' for t in times)}); one plain "
            f"PyTorch forward of the context {forward:.3f} s: the estimate took {spent / forward:.2f} of them.")
    common.report("Attribution patching, the estimated map alone", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
