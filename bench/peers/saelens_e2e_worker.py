"""SAELens's side of bench.peers.saelens --end-to-end, run by the Python of SAELens's own venv (it imports nothing of
Glassbox): the bundled chat model as TransformerLens's HookedTransformer (its nanoGPT weights through TransformerLens's
own converter), and SAELens's own training runner reading the activations through it from the same token sequences
Glassbox reads, training a TopK SAE. Prints one JSON line: the seconds from the runner's start to its end (model
built before), and the explained variance of SAELens's forward on held-out rows that Glassbox read.

    <venv>/bin/python bench/peers/saelens_e2e_worker.py SEQS.pt HELD.pt --model models/chat --tokens 1048576 ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def hooked_transformer(folder: Path):
    """The nanoGPT checkpoint in `folder` (config.json, model.safetensors) as a HookedTransformer."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_nanogpt_weights
    config = json.loads((folder / "config.json").read_text())
    cfg = HookedTransformerConfig(
        n_layers=config["n_layer"], d_model=config["n_embd"], n_ctx=config["block_size"], n_heads=config["n_head"],
        d_head=config["n_embd"] // config["n_head"], d_mlp=4 * config["n_embd"], d_vocab=config["vocab_size"],
        act_fn="gelu", normalization_type="LN", positional_embedding_type="standard", device="cpu")
    state = load_file(str(folder / "model.safetensors"))
    state.setdefault("lm_head.weight", state["transformer.wte.weight"])  # tied, as nanoGPT ties them
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_nanogpt_weights(state, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    return model.eval()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("seqs", help="a (N, T) tensor of token ids: the sequences the runner reads, in order")
    p.add_argument("held", help="(M, d_in) held-out activation rows (Glassbox read them)")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--layer", type=int, default=2)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from sae_lens import __version__
    from sae_lens.config import LanguageModelSAERunnerConfig, LoggingConfig
    from sae_lens.llm_sae_training_runner import LanguageModelSAETrainingRunner
    from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

    model = hooked_transformer(args.model)
    seqs = torch.load(args.seqs)
    dataset = Dataset.from_dict({"input_ids": seqs.tolist()})
    hook = f"blocks.{args.layer}.hook_resid_post"
    config = LanguageModelSAERunnerConfig(
        sae=TopKTrainingSAEConfig(d_in=model.cfg.d_model, d_sae=args.width, k=args.k),
        model_name="glassbox-bundled", hook_name=hook, dataset_path="", is_dataset_tokenized=True, streaming=False,
        context_size=seqs.size(1), prepend_bos=False, training_tokens=args.tokens,
        # its mixing buffer holds n_batches_in_buffer × context_size rows: as many as Glassbox's (8 steps' rows)
        train_batch_size_tokens=args.batch, store_batch_size_prompts=16,
        n_batches_in_buffer=8 * args.batch // seqs.size(1),
        lr=args.lr, lr_end=args.lr, device="cpu", act_store_device="cpu", dtype="float32",
        logger=LoggingConfig(log_to_wandb=False), n_checkpoints=0, checkpoint_path="/tmp/saelens-e2e-checkpoints")
    runner = LanguageModelSAETrainingRunner(config, override_model=model, override_dataset=dataset)
    started = time.perf_counter()
    sae = runner.run()
    seconds = time.perf_counter() - started
    held = torch.load(args.held)
    with torch.no_grad():
        x_hat = sae(held)
        ev = 1.0 - float(((x_hat - held) ** 2).sum() / ((held - held.mean(0)) ** 2).sum())
        l0 = float((sae.encode(held) > 0).sum(-1).float().mean())
    print(json.dumps({"seconds": seconds, "tokens": args.tokens, "explained_variance": ev, "l0": l0,
                      "version": __version__}))


if __name__ == "__main__":
    main()
