"""Train the bundled demo chat model on the synthetic corpus, then evaluate it on held-out questions.

    python scripts/train_chat.py                # both stages (80 + 110 minutes on one CPU thread), writes models/chat/
    python scripts/train_chat.py --init models/chat   # the second stage alone, from a first stage's weights
    python scripts/train_chat.py --minutes 5 --stage2-minutes 0 --out /tmp/chat   # a short first stage only

Two stages. The first trains from scratch on the "base" mix (lr 3e-3, --minutes); the second continues
from its weights on the "sums" mix (more sums, hard and one-digit ones over-weighted; lr 1e-3 after a
short warm-up, --stage2-minutes). scripts/chat_corpus.py describes the mixes.

Every training sequence is formatted exactly as webapp/chat/model/prompt.py builds prompts:
[bos, *fewshot, user turn, assistant turn, user turn, ...] up to block_size, with the loss on the
answer bytes and <|assistant_end|> only. Many Q/A turns share one sequence so the fixed few-shot
prefix (~240 bytes) is paid once per sequence, and later turns train the later positions.
The learning rate follows the wall clock (cosine over each stage's minutes), so a slower machine trains
fewer steps but still ends with a decayed rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from chat_corpus import sample_train  # noqa: E402

from webapp.chat.model.gpt import GPT, GPTConfig  # noqa: E402
from webapp.chat.model.prompt import PromptBuilder  # noqa: E402
from webapp.chat.model.tokenizer import ByteTokenizer  # noqa: E402


def sinusoidal_(wpe: torch.Tensor, std: float = 0.02) -> None:
    """Start the (still learned) position embeddings as sinusoids (Vaswani et al.) instead of noise.

    A question sits anywhere in the packed 1024-token sequence, and answers copy from it; with
    random position vectors "look k bytes back" has to be learned position by position. Sinusoids
    make that one linear map from the start, so copying is learned much sooner.
    """
    T, C = wpe.shape
    pos = torch.arange(T, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, C, 2, dtype=torch.float32) * (-math.log(10000.0) / C))
    with torch.no_grad():
        wpe[:, 0::2] = torch.sin(pos * freq)
        wpe[:, 1::2] = torch.cos(pos * freq)
        wpe.mul_(std * math.sqrt(2))  # the same spread as the token embeddings' init


def make_sequence(rng: random.Random, builder: PromptBuilder, block_size: int, mix: str = "base"):
    """One dialogue of random Q/A turns: (x, y) of length block_size, y = -1 where no loss."""
    ids = [builder.bos, *builder.fewshot_ids]
    learn = [False] * len(ids)  # learn[i]: ids[i] is a target (answer byte or assistant_end)
    while True:
        qa = sample_train(rng, mix)
        user = builder.encode_turn("user", qa.question)
        reply = builder.encode_turn("assistant", qa.answer)
        if len(ids) + len(user) + len(reply) > block_size + 1:
            break
        ids += user + reply
        learn += [False] * len(user) + [False] + [True] * (len(reply) - 1)
    x = ids[:-1] + [0] * (block_size + 1 - len(ids))
    y = [t if keep else -1 for t, keep in zip(ids[1:], learn[1:])]
    y += [-1] * (block_size - len(y))
    return x, y


def get_batch(rng, builder, block_size, batch_size, mix="base"):
    xs, ys = zip(*(make_sequence(rng, builder, block_size, mix) for _ in range(batch_size)))
    return torch.tensor(xs), torch.tensor(ys)


def save(model: GPT, config: GPTConfig, out: Path, meta: dict):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    # lm_head.weight is the same tensor as wte (tied): safetensors refuses shared storage, and the
    # loader re-ties it, so only wte is written.
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")  # readers never see half a file
    cfg = {**config.__dict__, "tokenizer": "byte", **meta}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_init(init: Path) -> tuple[GPT, GPTConfig]:
    """A model from a directory written by save() (config.json + model.safetensors)."""
    from safetensors.torch import load_file

    cfg = json.loads((init / "config.json").read_text())
    config = GPTConfig(**{f: cfg[f] for f in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias")})
    model = GPT(config)
    state = load_file(str(init / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    model.lm_head.weight = model.transformer.wte.weight  # tied, as in training from scratch
    return model, config


def train(model: GPT, config: GPTConfig, args, *, stage: int, minutes: float, lr_max: float, warmup: int,
          mix: str, seed: int, meta: dict) -> dict:
    """One stage: AdamW, linear warm-up, cosine to lr_max / 10 over the wall-clock budget; saves to args.out."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    builder = PromptBuilder(ByteTokenizer(), config.block_size)
    decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]
    no_decay = [p_ for p_ in model.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr_max, betas=(0.9, 0.95))
    print(f"stage {stage}: {minutes} min on the {mix!r} mix, lr {lr_max:g}, seed {seed}", flush=True)

    budget = minutes * 60
    start = last_save = time.time()
    step, tokens, loss_avg = 0, 0, None
    min_lr = lr_max / 10
    while (elapsed := time.time() - start) < budget:
        frac = elapsed / budget
        lr = lr_max * (step + 1) / warmup if step < warmup else \
            min_lr + 0.5 * (lr_max - min_lr) * (1 + math.cos(math.pi * frac))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch(rng, builder, config.block_size, args.batch_size, mix)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # ~2x faster on this CPU (AMX)
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
        if step % 25 == 0:
            print(f"stage {stage} step {step:5d} loss {loss_avg:.4f} lr {lr:.2e} {elapsed / 60:5.1f} min "
                  f"{tokens / max(elapsed, 1e-9):.0f} tok/s", flush=True)
        if time.time() - last_save > args.save_every * 60:
            save(model, config, args.out, {**meta, f"stage{stage}": {"steps": step}})
            last_save = time.time()

    done = {"mix": mix, "steps": step, "train_minutes": round((time.time() - start) / 60, 1),
            "final_loss": round(loss_avg or 0.0, 4), "lr": lr_max, "seed": seed}
    save(model, config, args.out, {**meta, f"stage{stage}": done})
    print(f"stage {stage}: saved {args.out} after {step} steps, {done['train_minutes']} min, loss {loss_avg:.4f}",
          flush=True)
    return done


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=80.0, help="stage 1 (from scratch, 'base' mix): wall-clock budget")
    p.add_argument("--stage2-minutes", type=float, default=110.0,
                   help="stage 2 ('sums' mix, from stage 1's weights): wall-clock budget; 0 skips it")
    p.add_argument("--init", type=Path, default=None,
                   help="skip stage 1: stage 2 starts from this directory's config.json + model.safetensors")
    p.add_argument("--out", type=Path, default=ROOT / "models/chat")
    p.add_argument("--seed", type=int, default=1337, help="stage 1's seed; stage 2 uses seed + 1")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the machine is shared)")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3, help="stage 1's peak learning rate")
    p.add_argument("--stage2-lr", type=float, default=1e-3, help="stage 2's peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="stage 1's warm-up steps (stage 2: half)")
    p.add_argument("--save-every", type=float, default=5.0, help="minutes between checkpoints")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation at the end")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    meta = {"threads": args.threads, "batch_size": args.batch_size,
            "description": "Tiny byte-level demo model trained on synthetic Q/A (scripts/train_chat.py)"}
    if args.init is not None:
        model, config = load_init(args.init)
        prior = json.loads((args.init / "config.json").read_text())
        # the first stage as it was recorded (a model from before the stages kept its figures at the top level)
        meta["stage1"] = prior.get("stage1") or {k: prior[k] for k in ("steps", "train_minutes", "final_loss", "seed")
                                                  if k in prior}
        meta["init"] = str(args.init)
        print(f"model: {model.num_params() / 1e6:.2f}M parameters, from {args.init}, {config}", flush=True)
    else:
        torch.manual_seed(args.seed)
        config = GPTConfig(block_size=args.block_size, vocab_size=264,  # 261 ids padded to a multiple of 8
                           n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, bias=True)
        model = GPT(config)
        sinusoidal_(model.transformer.wpe.weight)
        print(f"model: {model.num_params() / 1e6:.2f}M parameters, {config}", flush=True)
        print(f"training on {args.threads} thread(s)", flush=True)
        meta["stage1"] = train(model, config, args, stage=1, minutes=args.minutes, lr_max=args.lr,
                               warmup=args.warmup, mix="base", seed=args.seed, meta=meta)
    if args.stage2_minutes > 0:
        meta["stage2"] = train(model, config, args, stage=2, minutes=args.stage2_minutes, lr_max=args.stage2_lr,
                               warmup=max(1, args.warmup // 2), mix="sums", seed=args.seed + 1, meta=meta)

    if not args.no_eval:
        from eval_chat import evaluate

        evaluate(args.out / "model.safetensors")
        evaluate(args.out / "model.safetensors", history=2)


if __name__ == "__main__":
    main()
