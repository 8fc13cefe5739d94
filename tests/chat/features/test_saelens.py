"""Dictionaries in SAELens's format: what Glassbox writes reads back the same, a file laid out as SAELens 5 and 6
write theirs (TopK, standard, JumpReLU) encodes as the formulas written out here by hand from its tensors, and a
file that does not fit says which and why."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from webapp.chat.features import saelens
from webapp.chat.features.sae import Dictionary, DictionaryConfig
from webapp.chat.features.saelens import DictionaryFileError

D_IN, D_SAE = 16, 40


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(D_IN, D_SAE, generator=g), "W_dec": torch.randn(D_SAE, D_IN, generator=g),
            "b_enc": torch.randn(D_SAE, generator=g) * 0.1, "b_dec": torch.randn(D_IN, generator=g) * 0.1,
            "threshold": torch.rand(D_SAE, generator=g)}


def write(folder, cfg: dict, weights: dict[str, torch.Tensor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(weights, str(folder / "sae_weights.safetensors"))


def by_hand(t: dict[str, torch.Tensor], x: torch.Tensor, architecture: str, k: int = 0) -> torch.Tensor:
    pre = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
    if architecture == "jumprelu":
        return torch.where(pre > t["threshold"], pre, torch.zeros_like(pre))
    z = torch.relu(pre)
    if architecture == "topk":
        kth = z.topk(k, dim=-1).values[..., -1:]
        z = torch.where(z >= kth, z, torch.zeros_like(z))
    return z


X = torch.randn(7, D_IN, generator=torch.Generator().manual_seed(9))


def test_a_saelens_6_topk_file_encodes_as_the_formula(tmp_path):
    t = tensors()
    cfg = {"architecture": "topk", "d_in": D_IN, "d_sae": D_SAE, "k": 5, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": True, "normalize_activations": "none",
           "metadata": {"model_name": "gpt2", "hook_name": "blocks.3.hook_resid_post", "hook_head_index": None}}
    write(tmp_path / "d", cfg, {k: v for k, v in t.items() if k != "threshold"})
    sae = saelens.load(tmp_path / "d")
    assert sae.config.layer == 3 and sae.config.k == 5 and sae.config.hook_name == "blocks.3.hook_resid_post"
    z = sae.encode(X)
    torch.testing.assert_close(z, by_hand(t, X, "topk", 5))
    assert bool(((z > 0).sum(-1) <= 5).all())
    torch.testing.assert_close(sae.decode(z), z @ t["W_dec"] + t["b_dec"])


def test_a_saelens_5_topk_file_and_a_standard_and_a_jumprelu_one(tmp_path):
    t = tensors(1)
    base = {"d_in": D_IN, "d_sae": D_SAE, "hook_name": "blocks.0.hook_resid_post", "hook_layer": 0,
            "apply_b_dec_to_input": True, "normalize_activations": "none", "model_name": "gpt2"}
    write(tmp_path / "v5", {**base, "architecture": "standard", "activation_fn_str": "topk",
                            "activation_fn_kwargs": {"k": 3}}, {k: v for k, v in t.items() if k != "threshold"})
    write(tmp_path / "relu", {**base, "architecture": "standard", "activation_fn_str": "relu"},
          {k: v for k, v in t.items() if k != "threshold"})
    write(tmp_path / "jump", {**base, "architecture": "jumprelu"}, t)
    torch.testing.assert_close(saelens.load(tmp_path / "v5").encode(X), by_hand(t, X, "topk", 3))
    torch.testing.assert_close(saelens.load(tmp_path / "relu").encode(X), by_hand(t, X, "standard"))
    torch.testing.assert_close(saelens.load(tmp_path / "jump").encode(X), by_hand(t, X, "jumprelu"))


def test_what_glassbox_writes_is_saelens_s_layout_and_reads_back_the_same(tmp_path):
    sae = Dictionary(DictionaryConfig(D_IN, D_SAE, "topk", 4, 2, model_name="glassbox"))
    saelens.save(sae, tmp_path / "out", {"tokens": 10})
    cfg = json.loads((tmp_path / "out" / "cfg.json").read_text())
    assert (cfg["architecture"], cfg["d_in"], cfg["d_sae"], cfg["k"]) == ("topk", D_IN, D_SAE, 4)
    assert cfg["hook_name"] == cfg["metadata"]["hook_name"] == "blocks.2.hook_resid_post"
    assert cfg["normalize_activations"] == "none" and cfg["apply_b_dec_to_input"] is True
    weights = load_file(str(tmp_path / "out" / "sae_weights.safetensors"))
    assert {k: tuple(v.shape) for k, v in weights.items()} == {"W_enc": (D_IN, D_SAE), "W_dec": (D_SAE, D_IN),
                                                              "b_enc": (D_SAE,), "b_dec": (D_IN,)}
    back = saelens.load(tmp_path / "out")
    assert torch.equal(back.encode(X), sae.encode(X).detach())
    torch.testing.assert_close(back.W_dec.norm(dim=1), torch.ones(D_SAE))  # unit decoder rows


@pytest.mark.parametrize("change, words", [
    ({"architecture": "gated"}, "architecture 'gated' is not one Glassbox reads"),
    ({"hook_name": "blocks.0.attn.hook_z"}, "not the residual stream after a block"),
    ({"normalize_activations": "expected_average_only_in"}, "normalize_activations"),
    ({"k": 0}, "needs k from 1 to d_sae"),
    ({"d_sae": D_SAE + 1}, "W_enc is (16, 40), cfg.json makes it (16, 41)"),
])
def test_a_file_that_does_not_fit_says_which_and_why(tmp_path, change, words):
    t = tensors()
    cfg = {"architecture": "topk", "d_in": D_IN, "d_sae": D_SAE, "k": 4, "hook_name": "blocks.0.hook_resid_post",
           **change}
    write(tmp_path / "bad", cfg, {k: v for k, v in t.items() if k != "threshold"})
    with pytest.raises(DictionaryFileError, match="bad") as raised:
        saelens.load(tmp_path / "bad")
    assert words in str(raised.value)


def test_a_missing_or_broken_folder_is_named(tmp_path):
    with pytest.raises(DictionaryFileError, match="cfg.json: cannot read it"):
        saelens.load(tmp_path / "nowhere")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cfg.json").write_text("{not json")
    with pytest.raises(DictionaryFileError, match="not JSON"):
        saelens.load(tmp_path / "broken")
