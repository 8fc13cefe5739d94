"""python -m webapp.features train --model <name> --layer L --width W --k K --tokens N --corpus PATH --out DIR
python -m webapp.features contexts --model <name> --dictionary DIR --corpus PATH [--sequences 512]
python -m webapp.features quality --model <name> --dictionary DIR --corpus HELD_OUT [--dead-tokens 1000000] [--write]

Trains a TopK sparse dictionary of a chat model's residual stream after block L (several blocks: `--layer 1,2`,
one dictionary each, in DIR/blocks.L.hook_resid_post), writes it in SAELens's format and prints its quality on
held-out text. The model is the registry's (GLASSBOX_CHAT_MODELS) of that name, else the one the GLASSBOX_CHAT_*
settings load (the bundled model by default), on GLASSBOX_DEVICE. A progress line shows tokens/s and the
explained variance; Ctrl-C keeps the last step, and --resume goes on from it.

`contexts` works out, for a dictionary already made (here or by SAELens), each feature's density, top contexts
and activation histogram over the first --sequences sequences of a corpus, as `train` does after training, and
writes them beside it (glassbox_features.json): what its feature pages show.

`quality` gives a dictionary's figures (here or SAELens's) on a held-out corpus: explained variance, L0 and the
loss recovered over its first --sequences sequences, and the dead fraction over its first --dead-tokens tokens,
the window SAELens counts dead features over (over the few thousand tokens of the figures, "dead" mostly means
rare). --write keeps them in the dictionary's quality.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from webapp.chat.features import contexts, saelens
from webapp.chat.features.activations import CorpusError, corpus_files, documents, sequences
from webapp.chat.features.contexts import feature_contexts
from webapp.chat.features.quality import dead_fraction, quality
from webapp.chat.features.sae import Dictionary
from webapp.chat.features.saelens import DictionaryFileError
from webapp.chat.features.train import STATE, Plan, Progress, folder_of, train
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.loading import LoadedChatModel, load_chat_model
from webapp.chat.registry import model_entries
from webapp.config import ConfigError, Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.features", description=__doc__.split("\n\n")[1])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train a dictionary")
    run.add_argument("--model", default=None, help="the registry's name (default: the first model)")
    run.add_argument("--layer", required=True, help="the block (0-based) whose output it reads; several: 1,2")
    run.add_argument("--width", type=int, required=True, help="features in the dictionary (d_sae)")
    run.add_argument("--k", type=int, required=True, help="features active per token (TopK)")
    run.add_argument("--tokens", type=int, required=True, help="training tokens")
    run.add_argument("--corpus", type=Path, required=True, help="a .txt or .jsonl file, or a folder of them")
    run.add_argument("--out", type=Path, required=True, help="the folder the dictionary is written into")
    run.add_argument("--context", type=int, default=128, help="tokens per sequence (128)")
    run.add_argument("--batch", type=int, default=4096, help="activation rows per step (4096)")
    run.add_argument("--lr", type=float, default=None, help="learning rate (2e-4 / sqrt(width / 16384) "
                     "times the activations' mean norm / sqrt(d_in))")
    run.add_argument("--eval-sequences", type=int, default=64, help="held-out sequences for the figures (64)")
    run.add_argument("--context-sequences", type=int, default=512,
                     help="sequences of the corpus read for each feature's top contexts and density (512; 0: none)")
    run.add_argument("--resample-below", type=float, default=0.0,
                     help="start again, at 20%%, 40%% and 60%% of training, the features that fired on fewer than this "
                          "fraction of the tokens since the last look (e.g. 1e-4; 0: never)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--resume", action="store_true", help="go on from the checkpoint in --out")
    read = made_dictionary(commands.add_parser("contexts", help="work out a dictionary's top contexts, density "
                                               "and histograms"), "a .txt or .jsonl file, or a folder of them")
    read.add_argument("--sequences", type=int, default=512, help="sequences of the corpus read (512)")
    judge = made_dictionary(commands.add_parser("quality", help="a dictionary's figures on a held-out corpus"),
                            "held-out text: a .txt or .jsonl file, or a folder")
    judge.add_argument("--sequences", type=int, default=64, help="sequences for the figures (64)")
    judge.add_argument("--dead-tokens", type=int, default=1_000_000, help="tokens the dead fraction is counted over")
    judge.add_argument("--write", action="store_true", help="keep the figures in the dictionary's quality.json")
    args = parser.parse_args(argv)
    if args.command == "contexts":
        return contexts_command(args)
    if args.command == "quality":
        return quality_command(args)
    try:
        name, loaded = load(args.model)
        layers = tuple(int(part) for part in str(args.layer).split(","))
        n_layer = int(loaded.model.config.n_layer)  # type: ignore[union-attr, arg-type]
        bad = [layer for layer in layers if not 0 <= layer < n_layer]
        if bad:
            raise ValueError(f"--layer {bad[0]}: the model has blocks 0 to {n_layer - 1}")
        if not 0 < args.k <= args.width:
            raise ValueError(f"--k must be from 1 to --width ({args.width})")
        if not 0 <= args.resample_below < 1:
            raise ValueError(f"--resample-below is a fraction of tokens, from 0 to below 1; got {args.resample_below}")
        corpus_files(args.corpus)  # a missing or empty corpus, said before anything runs
    except (ConfigError, ModelLoadError, CorpusError, ValueError) as error:
        print(f"cannot train: {error}", file=sys.stderr)
        return 2
    plan = Plan(layers, args.width, args.k, args.tokens, context=args.context, batch=args.batch, lr=args.lr,
                eval_sequences=args.eval_sequences, seed=args.seed, resample_below=args.resample_below)
    model = loaded.model
    started = time.monotonic()
    try:
        saes = train(model, loaded.prompt, args.corpus, plan, args.out, name, args.resume, report=_progress)
    except KeyboardInterrupt:
        print(f"\nstopped: the last step is kept in {args.out} (--resume goes on)", file=sys.stderr)
        return 130
    except CorpusError as error:
        print(f"\ncannot train: {error}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    state = args.out / STATE
    trained = torch.load(state, weights_only=False)["step"] * plan.batch if state.exists() else 0
    if trained < plan.tokens:
        print(f"the corpus ran out after {trained:,} of {plan.tokens:,} tokens", file=sys.stderr)
    held_out = list(zip(range(plan.eval_sequences), sequences(documents(corpus_files(args.corpus), loaded.prompt),
                                                               plan.context)))
    for layer, sae in saes.items():
        figures = quality(model, sae, [seq for _, seq in held_out])
        folder = folder_of(args.out, plan, layer)
        report = {"layer": layer, "width": plan.width, "k": plan.k, "tokens": plan.tokens,
                  "seconds": round(time.monotonic() - started, 1), "explained_variance": figures.explained_variance,
                  "l0": figures.l0, "dead_fraction": figures.dead_fraction, "ce_clean": figures.ce_clean,
                  "ce_spliced": figures.ce_spliced, "ce_zero": figures.ce_zero,
                  "loss_recovered": figures.loss_recovered, "held_out_tokens": figures.tokens,
                  "dead_tokens": figures.tokens}
        (folder / "quality.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report))
        if args.context_sequences:  # where each feature fires most, for its page
            seqs = itertools.islice(sequences(documents(corpus_files(args.corpus), loaded.prompt), plan.context),
                                    args.context_sequences)
            contexts.save(feature_contexts(model, sae, seqs), folder)
    return 0


def made_dictionary(command: argparse.ArgumentParser, corpus: str) -> argparse.ArgumentParser:
    """The arguments of a command on a dictionary already made: the model, the dictionary, a corpus, the context."""
    command.add_argument("--model", default=None, help="the registry's name (default: the first model)")
    command.add_argument("--dictionary", type=Path, required=True, help="the dictionary's folder (SAELens's files)")
    command.add_argument("--corpus", type=Path, required=True, help=corpus)
    command.add_argument("--context", type=int, default=128, help="tokens per sequence (128)")
    return command


def dictionary_of(args: argparse.Namespace) -> tuple[LoadedChatModel, Dictionary]:
    """(the model, the dictionary) a command names, checked to fit each other and the corpus to be there.
    Raises ConfigError, ModelLoadError, CorpusError, DictionaryFileError, ValueError."""
    if args.sequences < 1 or args.context < 2:
        raise ValueError("--sequences must be at least 1 and --context at least 2")
    _, loaded = load(args.model)
    model: Any = loaded.model  # nanoGPT's layout
    sae = saelens.load(args.dictionary)
    width, n_layer = model.config.n_embd, model.config.n_layer
    if sae.config.d_in != width:
        raise ValueError(f"{args.dictionary}: d_in is {sae.config.d_in}, the model's width is {width}")
    if not 0 <= sae.config.layer < int(n_layer):
        raise ValueError(f"{args.dictionary}: {sae.config.hook_name} reads a block the model does not have")
    corpus_files(args.corpus)
    return loaded, sae.to(model.transformer.wte.weight.device)


def contexts_command(args: argparse.Namespace) -> int:
    """`contexts`: the statistics of a dictionary already made, written beside it."""
    try:
        loaded, sae = dictionary_of(args)
    except (ConfigError, ModelLoadError, CorpusError, DictionaryFileError, ValueError) as error:
        print(f"cannot read contexts: {error}", file=sys.stderr)
        return 2
    model: Any = loaded.model
    started = time.monotonic()
    seqs = itertools.islice(sequences(documents(corpus_files(args.corpus), loaded.prompt), args.context),
                            args.sequences)
    try:
        stats = feature_contexts(model, sae, seqs)
    except CorpusError as error:
        print(f"cannot read contexts: {error}", file=sys.stderr)
        return 2
    contexts.save(stats, args.dictionary)
    silent = sum(1 for d in stats["density"] if d == 0)
    print(f"read {stats['tokens']:,} tokens in {time.monotonic() - started:.1f} s; {silent} of {len(stats['density'])}"
          f" features silent; wrote {args.dictionary / contexts.FILE}")
    return 0


def quality_command(args: argparse.Namespace) -> int:
    """`quality`: a dictionary's figures on held-out text; the dead fraction over a window of --dead-tokens."""
    try:
        loaded, sae = dictionary_of(args)
        if args.dead_tokens < 1:
            raise ValueError("--dead-tokens must be at least 1")
        started = time.monotonic()

        def read() -> Iterator[list[int]]:
            return sequences(documents(corpus_files(args.corpus), loaded.prompt), args.context)

        figures = quality(loaded.model, sae, list(itertools.islice(read(), args.sequences)))
        dead, dead_tokens = dead_fraction(loaded.model, sae, itertools.islice(
            read(), max(args.sequences, -(-args.dead_tokens // (args.context - 1)))))
    except (ConfigError, ModelLoadError, CorpusError, DictionaryFileError, ValueError) as error:
        print(f"cannot judge the dictionary: {error}", file=sys.stderr)
        return 2
    if dead_tokens < args.dead_tokens:
        print(f"the corpus ran out after {dead_tokens:,} of {args.dead_tokens:,} tokens", file=sys.stderr)
    report = {"explained_variance": figures.explained_variance, "l0": figures.l0, "ce_clean": figures.ce_clean,
              "ce_spliced": figures.ce_spliced, "ce_zero": figures.ce_zero, "loss_recovered": figures.loss_recovered,
              "held_out_tokens": figures.tokens, "dead_fraction": dead, "dead_tokens": dead_tokens,
              "silent_in_held_out": figures.dead_fraction, "held_out": args.corpus.name,
              "judged_in_seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(report))
    if args.write:
        path = args.dictionary / "quality.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**kept, **report}, indent=2) + "\n")
    return 0


def load(name: str | None) -> tuple[str, LoadedChatModel]:
    """The registry's model of that name (default: the first), loaded for training on GLASSBOX_DEVICE."""
    settings = Settings.from_env()
    entries = model_entries(settings)
    entry = entries[0] if name is None else next((e for e in entries if e.name == name), None)
    if entry is None:
        raise ValueError(f"--model {name!r}: the registry has {', '.join(e.name for e in entries)}")
    if entry.settings.chat_backend:
        raise ValueError(f"--model {entry.name!r} runs on a remote backend: there is no residual stream here")
    s = entry.settings
    loaded = load_chat_model(s.chat_checkpoint, arch=s.chat_arch or None, tokenizer_spec=s.chat_tokenizer or None,
                             factory=s.chat_factory or None, device=s.device, dtype=torch.float32)
    return entry.name, loaded


def _progress(p: Progress) -> None:
    figures = "  ".join(f"L{layer}: EV {ev:.3f} L0 {p.l0[layer]:.1f}" for layer, ev in p.explained_variance.items())
    print(f"\rstep {p.step}  {p.tokens:,} tokens  {p.tokens_per_second:,.0f} tokens/s  {figures}", end="",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
