"""Training a dictionary from the command line on the bundled chat model: SAELens's files written, the figures
on held-out text, Ctrl-C-safe resume, and a clear refusal for a corpus or a block that is not there; the quality
module's spliced loss equals a splice written out by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from tests.conftest import ROOT
from webapp.chat.features import saelens
from webapp.chat.features.activations import ShuffleBuffer
from webapp.chat.features.quality import quality
from webapp.chat.features.sae import Dictionary, DictionaryConfig
from webapp.chat.model.gpt import GPT, GPTConfig


def corpus(tmp_path, lines: int = 400) -> str:
    path = tmp_path / "corpus.jsonl"
    with path.open("w") as out:
        for i in range(lines):
            out.write(json.dumps({"user": f"What is {i % 50} + {i % 7}?",
                                  "assistant": f"{i % 50} + {i % 7} = {i % 50 + i % 7}."}) + "\n")
    return str(path)


def features(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webapp.features", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_the_command_line_trains_a_saelens_dictionary_of_the_bundled_model_and_resumes(tmp_path):
    out = tmp_path / "d"
    common = ["train", "--layer", "1", "--width", "64", "--k", "4", "--corpus", corpus(tmp_path, 2000),
              "--out", str(out), "--batch", "512", "--context", "64", "--eval-sequences", "4"]
    run = features(*common, "--tokens", "4096")
    assert run.returncode == 0, run.stderr
    assert "tokens/s" in run.stderr and "EV" in run.stderr
    cfg = json.loads((out / "cfg.json").read_text())
    assert (cfg["architecture"], cfg["d_in"], cfg["d_sae"], cfg["k"], cfg["hook_name"]) == \
        ("topk", 256, 64, 4, "blocks.1.hook_resid_post")
    figures = json.loads((out / "quality.json").read_text())
    assert figures["l0"] == pytest.approx(4.0) and 0 <= figures["dead_fraction"] <= 1
    assert figures["ce_clean"] <= figures["ce_spliced"] + 1e-6 or figures["loss_recovered"] <= 1.0
    assert json.loads(run.stdout.strip().splitlines()[-1])["explained_variance"] == figures["explained_variance"]
    stats = json.loads((out / "glassbox_features.json").read_text())  # each feature's density and top contexts
    assert len(stats["density"]) == 64 and len(stats["top"]) == 64 and stats["tokens"] > 0
    first = saelens.load(out)
    state = torch.load(out / "glassbox_training.pt", weights_only=False)
    assert state["step"] == 8 and state["sequences_read"] > 0
    again = features(*common, "--tokens", "8192", "--resume")
    assert again.returncode == 0, again.stderr
    assert torch.load(out / "glassbox_training.pt", weights_only=False)["step"] == 16  # went on from step 8
    assert not torch.equal(saelens.load(out).W_dec, first.W_dec)


def test_contexts_works_out_a_made_dictionarys_statistics_as_training_does(tmp_path):
    out = tmp_path / "d"
    text = corpus(tmp_path, 2000)
    trained = features("train", "--layer", "1", "--width", "64", "--k", "4", "--tokens", "2048", "--corpus", text,
                       "--out", str(out), "--batch", "512", "--context", "64", "--eval-sequences", "2",
                       "--context-sequences", "8")
    assert trained.returncode == 0, trained.stderr
    made = json.loads((out / "glassbox_features.json").read_text())
    (out / "glassbox_features.json").unlink()
    run = features("contexts", "--dictionary", str(out), "--corpus", text, "--sequences", "8", "--context", "64")
    assert run.returncode == 0, run.stderr
    assert "features silent" in run.stdout
    again = json.loads((out / "glassbox_features.json").read_text())
    assert again == made  # the same sequences read: the same density, contexts and histograms
    counts = again["histogram"]["counts"]
    assert len(counts) == 64 and sum(map(sum, counts)) == 4 * again["tokens"]  # k = 4 active at every token
    wrong = features("contexts", "--dictionary", str(tmp_path / "nowhere"), "--corpus", text)
    assert wrong.returncode == 2 and "cannot read contexts" in wrong.stderr


@pytest.mark.parametrize("change, words", [
    ({"--layer": "4"}, "--layer 4: the model has blocks 0 to 3"),
    ({"--corpus": "/nowhere/at/all"}, "no such file or folder"),
    ({"--k": "65"}, "--k must be from 1 to --width"),
])
def test_a_bad_request_says_what_is_wrong_and_trains_nothing(tmp_path, change, words):
    args = {"--layer": "1", "--width": "64", "--k": "4", "--tokens": "1024", "--corpus": corpus(tmp_path, 10),
            "--out": str(tmp_path / "d"), **change}
    run = features("train", *[item for pair in args.items() for item in pair])
    assert run.returncode == 2 and words in run.stderr, run.stderr
    assert not (tmp_path / "d").exists()


def test_a_corpus_that_is_not_text_is_refused_by_name(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_bytes(b"\xff\xfe\x00bad")
    run = features("train", "--layer", "0", "--width", "32", "--k", "2", "--tokens", "512", "--corpus",
                   str(tmp_path / "c"), "--out", str(tmp_path / "d"), "--batch", "64")
    assert run.returncode == 2 and "a.txt: not UTF-8 text" in run.stderr, run.stderr
    (tmp_path / "empty").mkdir()
    run = features("train", "--layer", "0", "--width", "32", "--k", "2", "--tokens", "512", "--corpus",
                   str(tmp_path / "empty"), "--out", str(tmp_path / "d"))
    assert run.returncode == 2 and "no .txt or .jsonl file" in run.stderr


def test_the_spliced_loss_is_the_model_run_with_the_stream_replaced_by_hand():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50, n_layer=2, n_head=2, n_embd=16)).eval()
    sae = Dictionary(DictionaryConfig(16, 24, "topk", 3, layer=0)).eval()
    seq = [(3 * i + 1) % 50 for i in range(20)]
    got = quality(model, sae, [seq])
    ids = torch.tensor([seq])

    def ce(replace) -> float:
        x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(20))
        for layer, block in enumerate(model.transformer.h):
            x = x + _attention(block, x)
            x = x + block.mlp(block.ln_2(x))
            if layer == 0 and replace is not None:
                x = torch.cat([x[:, :1], replace(x[:, 1:])], dim=1)  # the start token's stream as it is
        logits = model.lm_head(model.transformer.ln_f(x))[0, :-1]
        return float(F.cross_entropy(logits, ids[0, 1:]))

    with torch.no_grad():
        assert got.ce_clean == pytest.approx(ce(None), rel=1e-5)
        assert got.ce_spliced == pytest.approx(ce(lambda x: sae(x[0])[1][None]), rel=1e-5)
        assert got.ce_zero == pytest.approx(ce(torch.zeros_like), rel=1e-5)
    assert got.loss_recovered == pytest.approx((got.ce_zero - got.ce_spliced) / (got.ce_zero - got.ce_clean))


def _attention(block, x):
    T, C = x.size(1), x.size(2)
    q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(1, T, 2, C // 2).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return block.attn.c_proj(y.transpose(1, 2).reshape(1, T, C))


def test_the_shuffle_buffer_hands_every_row_out_once_in_a_new_order():
    buffer = ShuffleBuffer(100, 2, seed=1)
    rows = torch.arange(200, dtype=torch.float32).view(100, 2)
    assert buffer.add(torch.cat([rows, rows[:5]])).size(0) == 5 and buffer.full()
    taken = torch.cat([buffer.take(30), buffer.take(30), buffer.take(100)])
    assert sorted(taken[:, 0].tolist()) == rows[:, 0].tolist() and buffer.n == 0
    assert taken[:30, 0].tolist() != rows[:30, 0].tolist()


@pytest.mark.parametrize("given", [None, 3e-3])
def test_the_learning_rate_is_gaos_times_the_first_rows_mean_norm_over_root_d_in_unless_given(tmp_path, given):
    """The stream's scale is each model's own: the default rate follows it (a stream of large norm learned far
    slower at the bare rate); a rate given is used as given."""
    from pathlib import Path

    from webapp.chat.features.activations import activations, corpus_files, documents, sequences
    from webapp.chat.features.train import STATE, Plan, train
    from webapp.chat.model.prompt import PromptBuilder
    from webapp.chat.model.tokenizer import ByteTokenizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=264, n_layer=2, n_head=2, n_embd=16)).eval()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(300)  # a stream far from norm √16
        model.transformer.h[1].mlp.c_proj.weight.mul_(3000)  # and larger after block 1 than after block 0
    prompt = PromptBuilder(ByteTokenizer(), 64)
    plan = Plan((0, 1), 32, 4, 256, context=32, batch=64, buffer_batches=2, eval_sequences=2,
                sequences_per_forward=4, lr=given)
    train(model, prompt, Path(corpus(tmp_path)), plan, tmp_path / "out")
    groups = torch.load(tmp_path / "out" / STATE, weights_only=False)["optimiser"]["param_groups"]
    seqs = list(sequences(documents(corpus_files(Path(corpus(tmp_path))), prompt), 32))[2:8]
    read = list(activations(model, iter(seqs), [0, 1], 4))
    norms = [float(torch.cat([found[layer] for found, _ in read])[:128].norm(dim=-1).mean()) for layer in (0, 1)]
    assert min(norms) > 16 and norms[1] > 1.5 * norms[0]  # far from √16, and each block its own
    for group, norm in zip(groups, norms):  # one rate per dictionary, from its own block's stream
        want = given if given is not None else 2e-4 / (32 / 2**14) ** 0.5 * norm / 4
        assert group["lr"] == pytest.approx(want, rel=1e-5)


def test_resampling_starts_the_rare_features_again_on_the_worst_reconstructed_rows_and_leaves_the_rest():
    from webapp.chat.features.train import new_optimiser, resample, train_step
    torch.manual_seed(0)
    sae = Dictionary(DictionaryConfig(16, 32, "topk", 4))
    optimiser = new_optimiser({0: sae}, 1e-3)
    x = torch.randn(64, 16)
    train_step({0: sae}, {0: x}, optimiser, {0: torch.zeros(32, dtype=torch.long)})  # Adam has moments now
    before = {name: p.detach().clone() for name, p in sae.named_parameters()}
    rare = torch.zeros(32, dtype=torch.bool)
    rare[[3, 7, 20]] = True
    x[5] *= 50  # the worst reconstructed row by far: a rare feature starts on it
    assert resample(sae, x, rare, optimiser, optimiser.param_groups[0]) == 3
    directions = (x - sae.b_dec) / (x - sae.b_dec).norm(dim=-1, keepdim=True)
    rows = []
    for f in (3, 7, 20):
        matches = [i for i in range(64) if torch.allclose(sae.W_dec[f], directions[i], atol=1e-5)]
        assert len(matches) == 1  # a row of the batch, its direction from b_dec
        rows.append(matches[0])
        assert torch.allclose(sae.W_enc[:, f] / sae.W_enc[:, f].norm(), directions[matches[0]], atol=1e-5)
        assert sae.b_enc[f] == 0
        assert (optimiser.state[sae.W_dec]["exp_avg"][f] == 0).all()
        assert (optimiser.state[sae.W_enc]["exp_avg_sq"][:, f] == 0).all()
    assert 5 in rows and len(set(rows)) == 3  # the worst row first, each feature on a row of its own
    live = ~rare
    torch.testing.assert_close(sae.W_dec[live], before["W_dec"][live])  # the others untouched
    torch.testing.assert_close(sae.W_enc[:, live], before["W_enc"][:, live])
    expected_norm = before["W_enc"][:, live].norm(dim=0).mean()
    torch.testing.assert_close(sae.W_enc[:, 3].norm(), expected_norm)
    assert resample(sae, x, torch.zeros(32, dtype=torch.bool), optimiser, optimiser.param_groups[0]) == 0


def test_the_command_line_resamples_when_asked(tmp_path):
    text = corpus(tmp_path)
    trained = features("train", "--layer", "1", "--width", "64", "--k", "4", "--tokens", "4096", "--batch", "512",
                       "--corpus", text, "--out", str(tmp_path / "d"), "--resample-below", "0.05",
                       "--eval-sequences", "4", "--context-sequences", "0")
    assert trained.returncode == 0, trained.stderr[-2000:]
    plan = json.loads((tmp_path / "d" / "cfg.json").read_text())["metadata"]["glassbox"]["plan"]
    assert plan["resample_below"] == 0.05
    refused = features("train", "--layer", "1", "--width", "64", "--k", "4", "--tokens", "4096", "--corpus", text,
                       "--out", str(tmp_path / "e"), "--resample-below", "2")
    assert refused.returncode == 2 and "--resample-below" in refused.stderr


def test_the_dead_fraction_is_the_features_active_on_no_token_of_the_window_by_hand():
    """Counted in batches through the hooked forward; by hand, one sequence at a time through the forward written
    out, the start token left out as everywhere."""
    from webapp.chat.features.quality import dead_fraction
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=32, vocab_size=50, n_layer=2, n_head=2, n_embd=16)).eval()
    sae = Dictionary(DictionaryConfig(16, 64, "topk", 2, layer=1)).eval()
    seqs = [[(5 * i + 7 * j) % 50 for j in range(12)] for i in range(7)]  # 7 sequences: batches of 3, 3 and 1
    fired = torch.zeros(64, dtype=torch.bool)
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq])
            x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(12))
            for block in model.transformer.h:
                x = x + _attention(block, x)
                x = x + block.mlp(block.ln_2(x))
            fired |= (sae.encode(x[0, 1:]) > 0).any(0)
    dead, tokens = dead_fraction(model, sae, iter(seqs), batch=3)
    assert tokens == 7 * 11 and dead == pytest.approx(1 - float(fired.float().mean()))
    assert 0 < dead < 1  # k = 2 of 64 on 77 tokens: some fire, some never do


def test_quality_judges_a_made_dictionary_on_held_out_text_and_counts_the_dead_over_its_window(tmp_path):
    out = tmp_path / "d"
    trained = features("train", "--layer", "1", "--width", "64", "--k", "4", "--tokens", "2048",
                       "--corpus", corpus(tmp_path, 2000), "--out", str(out), "--batch", "512", "--context", "64",
                       "--eval-sequences", "2", "--context-sequences", "0")
    assert trained.returncode == 0, trained.stderr
    made = json.loads((out / "quality.json").read_text())
    assert made["dead_tokens"] == made["held_out_tokens"] == 2 * 63  # the train command's: its held-out text
    held = tmp_path / "held"
    held.mkdir()
    (held / "other.jsonl").write_text("".join(json.dumps({"user": f"Name {i}.", "assistant": f"It is {i * 3}."})
                                              + "\n" for i in range(600)))
    run = features("quality", "--dictionary", str(out), "--corpus", str(held), "--sequences", "2",
                   "--context", "64", "--dead-tokens", "2000")
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["held_out_tokens"] == 2 * 63 and figures["dead_tokens"] == 32 * 63  # ceil(2000 / 63) sequences
    assert figures["dead_fraction"] <= figures["silent_in_held_out"]  # more tokens: no more features silent
    assert figures["l0"] == pytest.approx(4.0) and figures["held_out"] == "held"
    assert json.loads((out / "quality.json").read_text()) == made  # without --write: printed only
    kept = features("quality", "--dictionary", str(out), "--corpus", str(held), "--sequences", "2", "--context", "64",
                    "--dead-tokens", "100000", "--write")
    assert kept.returncode == 0 and "the corpus ran out after" in kept.stderr
    written = json.loads((out / "quality.json").read_text())
    assert written["dead_tokens"] < 100000 and written["width"] == 64 and written["tokens"] == 2048  # merged
    wrong = features("quality", "--dictionary", str(out), "--corpus", str(held), "--dead-tokens", "0")
    assert wrong.returncode == 2 and "--dead-tokens must be at least 1" in wrong.stderr
