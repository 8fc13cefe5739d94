"""SAELens's side of bench.peers.saelens, run by the Python of SAELens's own venv (it imports nothing of Glassbox):
train a TopK SAE with SAELens's own trainer (SAETrainer, TopKTrainingSAE) on the activation rows in a file, in the
order given, and print one JSON line: the seconds the training took, and the explained variance of SAELens's own
forward on the held-out rows.

    <venv>/bin/python bench/peers/saelens_worker.py ACTS.pt --width 2048 --k 32 --batch 4096 --lr 5.7e-4 --held 16384
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("acts")
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--held", type=int, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save", default="", help="a folder for SAELens's inference files (none: not saved)")
    p.add_argument("--hook", default="blocks.2.hook_resid_post")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from sae_lens import __version__
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    rows = torch.load(args.acts)  # (N, d_in), already in the order both trainers read
    train, held = rows[:-args.held], rows[-args.held:]
    steps = train.size(0) // args.batch
    torch.manual_seed(0)
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=rows.size(1), d_sae=args.width, k=args.k))
    with torch.no_grad():
        sae.b_dec.copy_(train[:args.batch * 8].mean(0))  # as Glassbox starts it: the first buffer's mean
    config = SAETrainerConfig(total_training_samples=steps * args.batch, train_batch_size_samples=args.batch,
                              lr=args.lr, lr_end=args.lr, device="cpu")  # a constant rate, as Glassbox
    batches = (train[i * args.batch:(i + 1) * args.batch] for i in range(steps))
    trainer = SAETrainer(config, sae, batches)
    started = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        x_hat = sae(held)
        ev = 1.0 - float(((x_hat - held) ** 2).sum() / ((held - held.mean(0)) ** 2).sum())
        l0 = float((sae.encode(held) > 0).sum(-1).float().mean())
    if args.save:  # SAELens's inference files, as a SAELens user trained on this hook would have them, and what
        # SAELens's own loader and encode then read from the first held-out rows (Glassbox opens the same folder)
        from sae_lens import SAE
        sae.cfg.metadata.hook_name = args.hook
        sae.save_inference_model(args.save)
        loaded = SAE.load_from_disk(args.save, device="cpu")
        with torch.no_grad():
            torch.save(loaded.encode(held[:512]), f"{args.save}/encoded_by_saelens.pt")
    print(json.dumps({"seconds": seconds, "tokens": steps * args.batch, "explained_variance": ev, "l0": l0,
                      "version": __version__}))


if __name__ == "__main__":
    main()
