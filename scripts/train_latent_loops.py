"""Train the Loop lab's latent-state looped transformer (webapp/loops/model/latent.py) on CPU.

    .venv/bin/python scripts/train_latent_loops.py --steps 3000 --seed 1 --out models/loops-latent \\
        --save-at 150

The tables, prompts and the stop loss are the bundled model's (scripts/train_loops.py). The difference:
a loop's input is the previous loop's state, so loops cannot be teacher-forced. Each step unrolls
--depth loops from the start letter and back-propagates through all of them: cross-entropy on x_t at
every loop (also past k: a run walks on), 0.3 x the same on the lookup's readout, the slot reader's
start letter and k digits, and the stop head on every loop 1..256 against each prompt's k (the head
never reads the state, so it learns every k the Loop lab takes while the hop is trained only to
--depth). The unrolled depth grows 1, 2, 4, … to --depth as the batches get every loop right (a
curriculum, as the bundled model's over k); --depth is the trained depth the Loop lab reports; every
loop past it is beyond training.
--save-at writes the weights after those steps to OUT-step-S (an early checkpoint).
"""

import argparse
import math
import random
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.train_loops import make_batch, stop_loss, unroll  # noqa: E402
from webapp.loops.model.checkpoint import save_bundle  # noqa: E402
from webapp.loops.model.latent import LatentLoopTransformer  # noqa: E402
from webapp.loops.model.looped import LoopConfig, loop_digits  # noqa: E402
from webapp.loops.model.tokenizer import CharTokenizer  # noqa: E402

MAX_K = 256


def losses(model: LatentLoopTransformer, batch, depth: int, args):
    ids, tables, starts, ks = batch
    traj = unroll(tables, starts, depth)                                   # [B, depth+1]
    out = model.unroll(ids, depth, MAX_K)
    targets = traj[:, 1:]
    hop = F.cross_entropy(out["scores"].flatten(0, 1), targets.flatten())
    if args.rule_weight:
        hop = hop + args.rule_weight * F.cross_entropy(out["rule_scores"].flatten(0, 1), tables.flatten())
    lookup = F.cross_entropy(out["state_logits"].flatten(0, 1), targets.flatten())
    start = F.cross_entropy(out["start_scores"], starts)
    digit = F.cross_entropy(out["digit_logits"].flatten(0, 1), loop_digits(ks, model.config.n_places).flatten())
    stop = stop_loss(out["stop_logits"], ks, args, model.config.n_places)
    total = hop + args.state_weight * lookup + 0.5 * (start + digit) + stop
    with torch.no_grad():
        right = out["scores"].argmax(-1) == targets                        # [B, depth]
        stats = {"hop": hop.item(), "stop": stop.item(), "hop_acc": right.float().mean().item(),
                 "all_right": right.all(1).float().mean().item()}
    return total, stats


def record(args, step: int, wall: float, depth: int, **as_if) -> dict:
    """config.json's training record: the command that writes these weights (a --save-at snapshot as
    the --stop-at run that writes the same ones), and the trained depth the Loop lab reports (`depth`:
    the loops unrolled when these weights were written)."""
    argv = list(sys.argv[1:])
    if as_if:
        keep, skip = [], False
        for a in argv:
            if skip:
                skip = False
                continue
            if a in ("--save-at", "--out", "--stop-at"):
                skip = True
                continue
            keep.append(a)
        argv = keep + ["--stop-at", str(as_if["stop_at"]), "--out", as_if["out"]]
    return {"command": " ".join(["python", "scripts/train_latent_loops.py"] + [shlex.quote(a) for a in argv]),
            "seed": args.seed, "steps": step, "wall_seconds": round(wall), "threads": args.threads,
            "trained_k": [1, depth], "args": {**vars(args), **as_if}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="the lr schedule follows steps: one thread "
                        "and the same seed give the same weights")
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this many steps of that run")
    parser.add_argument("--save-at", default="", metavar="S1,S2,…", help="also write OUT-step-S after step S")
    parser.add_argument("--depth", type=int, default=32, help="loops unrolled in training (the trained depth)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="models/loops-latent")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--near-miss-weight", type=float, default=4.0)
    parser.add_argument("--stop-pos-weight", type=float, default=8.0)
    parser.add_argument("--state-weight", type=float, default=0.3)
    parser.add_argument("--rule-weight", type=float, default=1.0,
                        help="weight of the every-rule-once loss (one loop from each letter's embedding); 0: none")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        save_at = {int(s) for s in args.save_at.split(",") if s.strip()}
    except ValueError:
        parser.error("--save-at takes step numbers separated by commas")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = CharTokenizer()
    config = replace(LoopConfig(readout_token_ids=tok.readout_token_ids, digit_token_ids=tok.digit_token_ids),
                     vocab_size=tok.vocab_size, carry="latent")
    model = LatentLoopTransformer(config)
    print(f"parameters: {model.num_params():,}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wte" not in n and "wpe" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.99))
    began, last = time.time(), min(args.steps, args.stop_at or args.steps)
    levels = [d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d < args.depth] + [args.depth]
    level, running, at_level = 0, 0.0, 0
    for step in range(1, last + 1):
        progress = (step - 1) / args.steps
        lr = args.lr * min(1.0, step / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        ks = [rng.randint(1, MAX_K) for _ in range(args.batch_size)]
        total, stats = losses(model, make_batch(args.batch_size, ks, rng, tok), levels[level], args)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running, at_level = 0.9 * running + 0.1 * stats["all_right"], at_level + 1
        if running >= 0.9 and at_level >= 50 and level < len(levels) - 1:
            level, running, at_level = level + 1, 0.0, 0
            print(f"step {step}: unrolls {levels[level]} loops now", flush=True)
        if step % 25 == 0:
            print(f"step {step} {time.time() - began:.0f}s depth {levels[level]} lr {lr:.2e} "
                  f"loss {total.item():.4f} hop {stats['hop']:.4f} stop {stats['stop']:.4f} "
                  f"hop_acc {stats['hop_acc']:.4f} all_right {stats['all_right']:.3f}",
                  flush=True)
        if step in save_at:
            out = f"{args.out}-step-{step}"
            model.eval()
            training = record(args, step, time.time() - began, levels[level], stop_at=step, out=out)
            print(f"step {step}: wrote {out} ({save_bundle(model, tok, out, training)})", flush=True)
            model.train()
    model.eval()
    checkpoint = save_bundle(model, tok, args.out, record(args, last, time.time() - began, levels[level]))
    print(f"done: {last} steps in {(time.time() - began) / 60:.1f} min, wrote {args.out} ({checkpoint})", flush=True)


if __name__ == "__main__":
    main()
