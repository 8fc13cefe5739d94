"""Training a dictionary: Glassbox against SAELens (`sae-lens` on PyPI, in a venv of its own under .bench/saelens/),
the same width, k, batch, learning rate and activation rows, in the same order, on the same CPU and threads.

    .venv/bin/python -m bench.peers.saelens                       # the first run makes SAELens's venv (pip, minutes)
    .venv/bin/python -m bench.peers.saelens --tokens 2000000 --no-doc
    .venv/bin/python -m bench.peers.saelens --end-to-end        # each reads the model its own way (SAELens:
                                                                # TransformerLens's HookedTransformer, its runner)

The rows: the bundled chat model's residual stream after block 2 on the project's own synthetic training text (what
scripts/train_dictionary.py trains the bundled dictionary on), read once through Glassbox's activation stream (its
rate is reported too: activations and training together are what a run from the command line costs), shuffled
once, saved, and read by both trainers. Glassbox trains with webapp/chat/features/train.py's step (train_step),
SAELens with its own SAETrainer and TopKTrainingSAE (its defaults but for width, k and lr: its AuxK weight, its
decoder initialisation, its rescaling by the decoder's norm). Timed: the training alone, tokens (rows) a second.
Quality: explained variance on the last --held rows, which neither trains on (SAELens's own forward for its SAE).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import common

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".bench" / "saelens"  # gitignored; nothing here is part of `make test`
VENV = HOME / "venv"
VPY = VENV / "bin" / "python"
SAE_LENS = "sae-lens==6.54.12"
TORCH = "torch==2.13.0"  # the CPU wheel; never unpinned: that would pull a CUDA build
WORKER = Path(__file__).with_name("saelens_worker.py")
E2E_WORKER = Path(__file__).with_name("saelens_e2e_worker.py")
SAVED = HOME / "trained_by_saelens"  # SAELens's dictionary in SAELens's files, opened by Glassbox
BUNDLED = ROOT / "models/chat/model.safetensors"
LAYER = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1_048_576, help="training rows (a multiple of --batch)")
    p.add_argument("--held", type=int, default=16_384, help="held-out rows for the explained variance")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--glassbox-lr-scale", type=float, default=1.0,
                   help="Glassbox's rate times this (SAELens keeps the default rate): each its own best rate")
    p.add_argument("--end-to-end", action="store_true",
                   help="each reads its own activations from the model (SAELens through TransformerLens's "
                        "HookedTransformer and its own training runner) from the same token sequences")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def setup() -> None:
    """SAELens's venv, made once: torch's CPU wheel first, then sae-lens (pinned)."""
    if VPY.exists():
        return
    HOME.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    for package in (TORCH, SAE_LENS):
        subprocess.run([str(VPY), "-m", "pip", "install", "-q", package], check=True)


def activation_rows(n: int) -> tuple[torch.Tensor, float]:
    """n rows of the bundled model's stream after block LAYER, shuffled once -> (rows, rows a second read)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from chat_corpus import write_jsonl

    from webapp.chat.features.activations import activations, corpus_files, documents, sequences
    from webapp.chat.model.loading import load_chat_model
    corpus = HOME / "corpus.jsonl"
    if not corpus.exists():
        HOME.mkdir(parents=True, exist_ok=True)
        write_jsonl(str(corpus), max(50_000, n // 6), seed=1)
    loaded = load_chat_model(str(BUNDLED))
    seqs = sequences(documents(corpus_files(corpus), loaded.prompt), 128)
    found, have = [], 0
    started = time.perf_counter()
    for rows, _ in activations(loaded.model, seqs, [LAYER], 16):
        found.append(rows[LAYER])
        have += rows[LAYER].size(0)
        if have >= n:
            break
    rate = have / (time.perf_counter() - started)
    if have < n:
        raise SystemExit(f"the corpus gave {have} rows; {n} asked for")
    rows = torch.cat(found)[:n]
    return rows[torch.randperm(n, generator=torch.Generator().manual_seed(0))], rate


def glassbox_training(rows: torch.Tensor, held: torch.Tensor, args) -> dict:
    from webapp.chat.features.sae import Dictionary, DictionaryConfig
    from webapp.chat.features.train import Plan, new_optimiser, train_step
    torch.manual_seed(0)
    plan = Plan((LAYER,), args.width, args.k, rows.size(0), batch=args.batch)
    sae = Dictionary(DictionaryConfig(rows.size(1), args.width, "topk", args.k, LAYER))
    with torch.no_grad():
        sae.b_dec.copy_(rows[:args.batch * 8].mean(0))  # the first buffer's mean, as train() starts it
    base = plan.learning_rate(float(rows[:args.batch * 8].norm(dim=-1).mean()), rows.size(1))  # as train() sets it
    lr = base * args.glassbox_lr_scale
    optimiser = new_optimiser({LAYER: sae}, lr)
    quiet = {LAYER: torch.zeros(args.width, dtype=torch.long)}
    started = time.perf_counter()
    for i in range(rows.size(0) // args.batch):
        train_step({LAYER: sae}, {LAYER: rows[i * args.batch:(i + 1) * args.batch]}, optimiser, quiet)
    seconds = time.perf_counter() - started
    with torch.no_grad():
        z = sae.encode(held)
        x_hat = sae.decode(z)
        ev = 1.0 - float(((x_hat - held) ** 2).sum() / ((held - held.mean(0)) ** 2).sum())
    return {"seconds": seconds, "tokens": rows.size(0), "explained_variance": ev,
            "l0": float((z > 0).sum(-1).float().mean()), "lr": lr, "base_lr": base}


def opened_here(rows: torch.Tensor) -> float:
    """The largest difference between SAELens's encode of these rows and Glassbox's, of the folder SAELens saved."""
    from webapp.chat.features import saelens
    sae = saelens.load(SAVED)
    with torch.no_grad():
        return float((sae.encode(rows) - torch.load(SAVED / "encoded_by_saelens.pt")).abs().max())


def run_end_to_end(args, load_before: str) -> None:
    """Activations and training together, each trainer its own way, on the same sequences of the same corpus (the
    ones Glassbox's `train` reads: after its held-out sequences), the explained variance on the same held-out rows
    (another seed's text, read by Glassbox)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from chat_corpus import write_jsonl

    from webapp.chat.features.activations import activations, corpus_files, documents, sequences
    from webapp.chat.features.train import Plan, train
    from webapp.chat.model.loading import load_chat_model
    HOME.mkdir(parents=True, exist_ok=True)
    corpus, held_corpus = HOME / "corpus.jsonl", HOME / "held.jsonl"
    if not corpus.exists():
        write_jsonl(str(corpus), max(50_000, args.tokens // 6), seed=1)
    if not held_corpus.exists():
        write_jsonl(str(held_corpus), 20_000, seed=2)
    loaded = load_chat_model(str(BUNDLED))
    plan = Plan((LAYER,), args.width, args.k, args.tokens, batch=args.batch)
    wanted = plan.eval_sequences + -(-args.tokens // (plan.context - 1)) + plan.buffer_batches * 40
    seqs = [s for _, s in zip(range(wanted), sequences(documents(corpus_files(corpus), loaded.prompt), plan.context))]
    torch.save(torch.tensor(seqs[plan.eval_sequences:]), HOME / "seqs.pt")
    held_seqs = itertools.islice(sequences(documents(corpus_files(held_corpus), loaded.prompt), plan.context),
                                 -(-args.held // (plan.context - 1)))
    held = torch.cat([rows[LAYER] for rows, _ in activations(loaded.model, held_seqs, [LAYER], 16)])[:args.held]
    torch.save(held.clone(), HOME / "held.pt")  # the rows alone, not the storage they were cut from
    started = time.perf_counter()
    ours = train(loaded.model, loaded.prompt, corpus, plan, HOME / "glassbox-e2e")[LAYER]
    seconds = time.perf_counter() - started
    with torch.no_grad():
        ev = 1.0 - float(((ours(held)[1] - held) ** 2).sum() / ((held - held.mean(0)) ** 2).sum())
    lr = plan.learning_rate(float(held.norm(dim=-1).mean()), held.size(1))
    worker = subprocess.run([str(VPY), str(E2E_WORKER), str(HOME / "seqs.pt"), str(HOME / "held.pt"), "--model",
                             str(BUNDLED.parent), "--layer", str(LAYER), "--tokens", str(args.tokens), "--width",
                             str(args.width), "--k", str(args.k), "--batch", str(args.batch), "--lr", str(lr),
                             "--threads", str(args.threads)], capture_output=True, text=True,
                            env={"TQDM_DISABLE": "1", "WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin"},
                            cwd=HOME)  # its runner writes its dictionary into ./output: kept under .bench
    if worker.returncode:
        raise SystemExit(f"SAELens's run failed:\n{worker.stderr[-3000:]}")
    theirs = json.loads(worker.stdout.strip().splitlines()[-1])
    ours_rate, their_rate = args.tokens / seconds, theirs["tokens"] / theirs["seconds"]
    body = (common.table(["end to end", "tokens/s", "explained variance (held out)", "seconds"],
                         [["Glassbox (`train`: its activation stream and its trainer)", f"{ours_rate:,.0f}",
                           f"{ev:.3f}", f"{seconds:.1f}"],
                          [f"SAELens {theirs['version']} (its runner, TransformerLens's HookedTransformer)",
                           f"{their_rate:,.0f}", f"{theirs['explained_variance']:.3f}", f"{theirs['seconds']:.1f}"]])
            + f"\n\n- Glassbox ÷ SAELens, end to end: **{ours_rate / their_rate:.2f}×**; explained variance "
              f"{ev - theirs['explained_variance']:+.3f}"
            + f"\n- the bundled chat model's stream after block {LAYER}, {args.width} features, k = {args.k}, "
              f"{args.tokens:,} tokens of the same {len(seqs) - plan.eval_sequences:,} sequences of 128 tokens, "
              f"batches of {args.batch}, Glassbox at its own rate, SAELens at {lr:.3g} (Glassbox's rule, on the "
              f"held-out rows' norm); held out: {held.size(0):,} rows of another seed's text; {args.threads} torch "
              f"threads each; SAELens's model built before its clock starts")
    common.report("Dictionary training against SAELens, end to end", body, load_before=load_before,
                  write_doc=not args.no_doc)


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    torch.set_num_threads(args.threads)
    setup()
    if args.end_to_end:
        run_end_to_end(args, load_before)
        return
    rows, read_rate = activation_rows(args.tokens + args.held)
    acts = HOME / "acts.pt"
    torch.save(rows, acts)
    train, held = rows[:-args.held], rows[-args.held:]
    ours = glassbox_training(train, held, args)
    worker = subprocess.run([str(VPY), str(WORKER), str(acts), "--width", str(args.width), "--k", str(args.k),
                             "--batch", str(args.batch), "--lr", str(ours["base_lr"]), "--held", str(args.held),
                             "--threads", str(args.threads), "--save", str(SAVED), "--hook",
                             f"blocks.{LAYER}.hook_resid_post"], capture_output=True, text=True,
                            env={"TQDM_DISABLE": "1", "WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin"})
    if worker.returncode:
        raise SystemExit(f"SAELens's run failed:\n{worker.stderr[-3000:]}")
    theirs = json.loads(worker.stdout.strip().splitlines()[-1])
    opened = opened_here(held[:512])
    ours_rate, their_rate = ours["tokens"] / ours["seconds"], theirs["tokens"] / theirs["seconds"]
    end_to_end = 1 / (1 / read_rate + 1 / ours_rate)
    rows_out = [["Glassbox", f"{ours_rate:,.0f}", f"{ours['explained_variance']:.3f}", f"{ours['l0']:.1f}",
                 f"{ours['seconds']:.1f}"],
                [f"SAELens {theirs['version']}", f"{their_rate:,.0f}", f"{theirs['explained_variance']:.3f}",
                 f"{theirs['l0']:.1f}", f"{theirs['seconds']:.1f}"]]
    body = (common.table(["trainer", "training rows/s", "explained variance (held out)", "L0", "seconds"], rows_out)
            + f"\n\n- Glassbox ÷ SAELens, training alone: **{ours_rate / their_rate:.2f}×**; explained variance "
              f"{ours['explained_variance'] - theirs['explained_variance']:+.3f}"
            + f"\n- the rows: the bundled chat model after block {LAYER} (256 wide), read by Glassbox's activation "
              f"stream at {read_rate:,.0f} rows/s; activations and Glassbox's training together {end_to_end:,.0f} "
              f"rows/s"
            + f"\n- {args.width} features, k = {args.k}, batches of {args.batch}, lr {ours['base_lr']:.3g} "
              f"(Glassbox's train() default; Glassbox here {ours['lr']:.3g}), "
              f"{train.size(0):,} training rows, {args.held:,} held out; {args.threads} torch threads each"
            + f"\n- SAELens's dictionary, saved by SAELens ({theirs['version']}, `save_inference_model`) and opened by "
              f"Glassbox: its activations on 512 held-out rows within {opened:.1e} of SAELens's own encode")
    common.report("Dictionary training against SAELens", body, load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
