"""Train the Loop-lab looped transformer on pointer chasing (CPU, fixed seed).

    .venv/bin/python scripts/train_loops.py --minutes 30 --seed 1 --out models/loops

Every step draws fresh random tables (mostly random functions, plus the web
page's presets, half with shuffled rule order), unrolls the trajectory and
supervises every loop: cross-entropy on x_t, binary cross-entropy on
stop = (t == k). Loops are teacher-forced (input letter = true x(t-1)): the
model's only carried state is the re-embedded letter, so when it is right the
teacher input equals its own argmax, and the teacher-forced joint score equals
the free-running one. A curriculum over k (8 -> 16 -> ... -> 256) sets half of
each batch; a quarter replays easier k and a quarter is drawn from all of
1..256 from the first step, so long loop counts are seen early. Negatives whose
loop number matches k in all but one digit place (k-1, k-10, k+100, ...) get
extra weight. Time-bounded by --minutes; writes a bundle via save_bundle.
"""

import argparse
import json
import math
import random
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from webapp.loops.model.checkpoint import save_bundle  # noqa: E402
from webapp.loops.model.looped import LoopConfig, LoopTransformer, loop_digits  # noqa: E402
from webapp.loops.model.tokenizer import CharTokenizer  # noqa: E402
from webapp.loops.task import SYMBOLS, preset, render_prompt, shuffle_rules  # noqa: E402

LEVELS = (8, 16, 32, 64, 128, 256)
MAX_K = 256
KINDS = (("function", 0.55), ("permutation", 0.2), ("cycle", 0.1), ("cycle_tail", 0.12),
         ("identity", 0.03))


def sample_k(level: int, n: int, rng: random.Random) -> list[int]:
    """Half at the current level, a quarter replay of easier k, a quarter long k."""
    low = 1 if level == LEVELS[0] else level // 2 + 1
    ks = []
    for i in range(n):
        share = i / n
        if share < 0.5:
            ks.append(rng.randint(low, level))
        elif share < 0.75:
            ks.append(rng.randint(1, level))
        else:
            ks.append(rng.randint(1, MAX_K))
    return ks


def make_batch(n: int, ks: list[int], rng: random.Random, tok: CharTokenizer):
    """Prompts [B, T], destination table [B, 26], starts [B], ks [B] (letters as 0..25)."""
    names, weights = zip(*KINDS)
    prompts, tables, starts = [], [], []
    for k in ks:
        pairs = preset(rng.choices(names, weights)[0], rng)
        if rng.random() < 0.5:
            pairs = shuffle_rules(pairs, rng)
        start = rng.choice(SYMBOLS)
        prompts.append(render_prompt(pairs, start, k))
        table = dict(pairs)
        tables.append([SYMBOLS.index(table[s]) for s in SYMBOLS])
        starts.append(SYMBOLS.index(start))
    return (tok.encode_batch(prompts), torch.tensor(tables), torch.tensor(starts),
            torch.tensor(ks))


def unroll(tables: torch.Tensor, starts: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, steps + 1] letters x0..x_steps."""
    xs = [starts]
    for _ in range(steps):
        xs.append(tables.gather(1, xs[-1].unsqueeze(1)).squeeze(1))
    return torch.stack(xs, 1)


def losses(model, batch, args):
    ids, tables, starts, ks = batch
    K = int(ks.max())
    traj = unroll(tables, starts, K)                                     # [B, K+1]
    letters = torch.arange(26).expand(len(ks), 26)
    inputs = torch.cat([traj[:, :K], letters], 1)                        # loops, then every rule once
    loops = torch.cat([torch.arange(1, K + 1), torch.zeros(26, dtype=torch.long)])
    out = model.teacher_forward(ids, inputs, loops)
    targets = torch.cat([traj[:, 1:], tables], 1)                        # [B, K+26]
    hop = F.cross_entropy(out["scores"].flatten(0, 1), targets.flatten())
    state = F.cross_entropy(out["state_logits"].flatten(0, 1), targets.flatten())
    start = F.cross_entropy(out["start_scores"], starts)
    digits = loop_digits(ks, model.config.n_places)                       # [B, P]
    digit = F.cross_entropy(out["digit_logits"].flatten(0, 1), digits.flatten())
    stop_logits = out["stop_logits"][:, :K]                               # [B, K]
    t = torch.arange(1, K + 1)
    stop = stop_loss(stop_logits, ks, args, model.config.n_places)
    total = hop + args.state_weight * state + 0.5 * (start + digit) + args.stop_weight * stop
    with torch.no_grad():
        pred = out["scores"][:, :K].argmax(-1)
        valid = t[None] <= ks[:, None]
        hops_ok = ((pred == traj[:, 1:]) | ~valid).all(1) & (out["start_scores"].argmax(-1) == starts)
        fired = stop_logits.sigmoid() >= 0.5
        first = torch.where(fired.any(1), fired.float().argmax(1) + 1, torch.full_like(ks, -1))
        joint = hops_ok & (first == ks)
    stats = {"hop": hop.item(), "stop": stop.item(), "start": start.item(), "digit": digit.item(),
             "hop_acc": (pred == traj[:, 1:]).float().mean().item()}
    return total, joint, stats


def stop_loss(stop_logits: torch.Tensor, ks: torch.Tensor, args, n_places: int) -> torch.Tensor:
    """Binary cross-entropy of the stop logits [B, L] (loops 1..L) on stop = (t == k): positives and
    near misses (the loop number one digit place off k: k-1, k-10, k+100, ...) weigh more."""
    t = torch.arange(1, stop_logits.size(1) + 1)
    target = (t[None] == ks[:, None]).float()
    same_places = (loop_digits(t)[None] == loop_digits(ks, n_places)[:, None]).sum(-1)   # [B, L]
    weight = 1 + args.near_miss_weight * (same_places == n_places - 1).float()
    weight = weight + (args.stop_pos_weight - 1) * target
    return F.binary_cross_entropy_with_logits(stop_logits, target, weight=weight)


@torch.no_grad()
def quick_eval(model, tok, seed: int, per_bucket: int = 64) -> dict:
    """Free-running joint success on a few held-out random functions per k bucket."""
    rng = random.Random(seed)
    model.eval()
    result = {}
    for low, high in ((1, 8), (9, 32), (33, 64), (65, 128), (129, 256)):
        ks = [rng.randint(low, high) for _ in range(per_bucket)]
        pairs = [preset("function", rng) for _ in ks]
        starts = [rng.choice(SYMBOLS) for _ in ks]
        ids = tok.encode_batch([render_prompt(p, s, k) for p, s, k in zip(pairs, starts, ks)])
        out = model(input_ids=ids, num_loops=272, readout_token_ids=tok.readout_token_ids)
        preds = out.scores.argmax(-1)
        ok = 0
        for b, (p, s, k) in enumerate(zip(pairs, starts, ks)):
            table, x = dict(p), s
            for _ in range(k):
                x = table[x]
            ok += int(out.halted_at[b]) == k and SYMBOLS[int(preds[b, k - 1])] == x
        result[f"{low}-{high}"] = ok / per_bucket
    model.train()
    return result


def training_record(args, step: int, wall: float, level: int, history: list, **as_if) -> dict:
    """What config.json records: the command that reproduces these weights (as_if: a --save-at
    snapshot is recorded as the --stop-at run that writes the same weights), seed, steps, args."""
    argv = sys.argv[1:]
    if as_if:
        argv = [a for i, a in enumerate(argv) if not a.startswith("--save-at")
                and not (i and argv[i - 1] == "--save-at")]
        argv = [a for i, a in enumerate(argv) if not a.startswith(("--stop-at", "--out"))
                and not (i and argv[i - 1] in ("--stop-at", "--out"))]
        argv += ["--stop-at", str(as_if["stop_at"]), "--out", as_if["out"]]
    recorded = {**vars(args), "save_at": "", **as_if} if as_if else vars(args)
    return {"command": " ".join(["python", "scripts/train_loops.py"] + [shlex.quote(a) for a in argv]),
            "seed": args.seed, "steps": step, "wall_seconds": round(wall), "final_level": level,
            "threads": args.threads, "args": recorded, "quick_eval": history[-3:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock training budget")
    parser.add_argument("--steps", type=int, default=None,
                        help="budget in steps instead of minutes: the lr schedule follows steps, so a rerun "
                             "with the same seed and one thread gives the same weights")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="with --steps: stop after this many steps of that run (an early checkpoint)")
    parser.add_argument("--save-at", default="", metavar="S1,S2,…",
                        help="with --steps: also write the checkpoint after each of these steps to OUT/step-S "
                             "(the same weights --stop-at S writes: a sweep for picking an early checkpoint)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="models/loops", help="bundle directory to write")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--hop-lr-scale", type=float, default=1.0,
                        help="learning rate × this for the prompt encoder and the loop block (< 1: the hop is "
                             "learned after the stop, for an early checkpoint that fails both ways)")
    parser.add_argument("--near-miss-weight", type=float, default=4.0)
    parser.add_argument("--stop-pos-weight", type=float, default=8.0)
    parser.add_argument("--stop-weight", type=float, default=1.0)
    parser.add_argument("--state-weight", type=float, default=0.3)
    parser.add_argument("--promote-at", type=float, default=0.9, help="running joint score to promote")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)  # the machine is shared
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = CharTokenizer()
    config = LoopConfig(vocab_size=tok.vocab_size, n_embd=args.n_embd,
                        readout_token_ids=tok.readout_token_ids, digit_token_ids=tok.digit_token_ids)
    model = LoopTransformer(config)
    print(f"parameters: {model.num_params():,}", flush=True)
    # --hop-lr-scale puts the hop's own parts (prompt encoder, loop block) in groups of their own; the
    # default keeps the optimizer exactly as the bundled model was trained (two groups).
    hop_parts = ("encoder.", "loop_block.")
    groups = []
    for hop in ([False, True] if args.hop_lr_scale != 1 else [False]):
        for decay in (True, False):
            params = [p for n, p in model.named_parameters()
                      if (args.hop_lr_scale == 1 or n.startswith(hop_parts) == hop)
                      and (p.dim() >= 2 and "wte" not in n and "wpe" not in n) == decay]
            groups.append({"params": params, "weight_decay": 0.01 if decay else 0.0,
                           "scale": args.hop_lr_scale if hop else 1.0})
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99))
    if args.stop_at is not None and args.steps is None:
        parser.error("--stop-at needs --steps (the run it stops early)")
    try:
        save_at = {int(s) for s in args.save_at.split(",") if s.strip()}
    except ValueError:
        parser.error("--save-at takes step numbers separated by commas")
    if save_at and args.steps is None:
        parser.error("--save-at needs --steps")
    budget, began = args.minutes * 60, time.time()
    level_index, running, at_level, step = 0, 0.0, 0, 0
    history = []

    def more() -> bool:
        if args.steps is not None:
            return step < min(args.steps, args.stop_at or args.steps)
        return time.time() - began < budget

    while more():
        elapsed = time.time() - began
        level = LEVELS[level_index]
        # Warmup, then cosine decay over the budget (time, or steps with --steps) to 10% of the peak.
        progress = step / args.steps if args.steps is not None else elapsed / budget
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr * param_group["scale"]
        ks = sample_k(level, args.batch_size, rng)
        total, joint, stats = losses(model, make_batch(args.batch_size, ks, rng, tok), args)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step, at_level = step + 1, at_level + 1
        current = joint[: args.batch_size // 2].float().mean().item()   # the current-level half
        running = 0.9 * running + 0.1 * current
        if running >= args.promote_at and at_level >= 50 and level_index < len(LEVELS) - 1:
            level_index, running, at_level = level_index + 1, 0.0, 0
            print(f"step {step}: promoted to k <= {LEVELS[level_index]}", flush=True)
        if step % 25 == 0:
            print(f"step {step} {elapsed:.0f}s level {level} lr {lr:.2e} loss {total.item():.4f} "
                  f"hop {stats['hop']:.4f} stop {stats['stop']:.4f} hop_acc {stats['hop_acc']:.4f} "
                  f"joint {joint.float().mean().item():.3f} running {running:.3f}", flush=True)
        if step % args.eval_every == 0:
            scores = quick_eval(model, tok, seed=10_000 + args.seed)
            history.append({"step": step, "seconds": round(elapsed), "joint": scores})
            print(f"step {step} quick eval joint: {json.dumps(scores)}", flush=True)

        if step in save_at:
            snapshot = Path(args.out) / f"step-{step}"
            model.eval()
            saved = save_bundle(model, tok, snapshot, training_record(args, step, time.time() - began,
                                                                      LEVELS[level_index], history,
                                                                      stop_at=step, out=str(snapshot)))
            model.train()
            print(f"step {step}: wrote {snapshot} ({saved})", flush=True)

    wall = time.time() - began
    model.eval()
    training = training_record(args, step, wall, LEVELS[level_index], history)
    checkpoint_id = save_bundle(model, tok, args.out, training)
    print(f"done: {step} steps in {wall / 60:.1f} min, level {LEVELS[level_index]}, "
          f"wrote {args.out} ({checkpoint_id})", flush=True)


if __name__ == "__main__":
    main()
