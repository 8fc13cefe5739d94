import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.chat.conftest import SEED_LIKE, random_gpt
from webapp.chat.decode.generate import generate
from webapp.chat.model.gpt import GPTConfig
from webapp.chat.model.loading import ModelLoadError, load_chat_model

EXAMPLE = "examples.owner_chat_model:build_model"  # the README's spelling; a file path works too
HEADS = "n_head=2"  # SEED_LIKE's heads: the one field a raw state dict's shapes do not show


def greedy_ids(loaded, prompt, n=12):
    """Token ids of a greedy reply of exactly n tokens (specials masked so random weights never stop)."""
    out = []
    tok = loaded.tokenizer
    original = tok.decode_single_token_bytes

    def spy(i):
        out.append(i)
        return original(i)

    def no_specials(module, args, logits):
        logits[..., tok.first_special_id:] = float("-inf")
        return logits
    hook = loaded.model.lm_head.register_forward_hook(no_specials)
    tok.decode_single_token_bytes = spy
    try:
        for _ in generate(loaded, prompt, max_new_tokens=n, temperature=0):
            pass
    finally:
        del tok.decode_single_token_bytes
        hook.remove()
    assert len(out) == n
    return out


def test_seed_format_loads_and_decodes_the_same_with_and_without_cache(seed_checkpoint, gpt2_ranks):
    loaded = load_chat_model(str(seed_checkpoint), arch=HEADS, tokenizer_spec=f"gpt2:{gpt2_ranks}")
    assert loaded.supports_kv_cache and loaded.block_size == 128 and not loaded.model.training
    assert loaded.checkpoint_id.startswith("model.pt@") and len(loaded.checkpoint_id) == len("model.pt@") + 12
    assert "2L/2H/128d" in loaded.description
    assert "GLASSBOX_CHAT_ARCH=n_head=2 + tensor shapes (" in loaded.description
    ids = loaded.prompt.build([{"role": "user", "content": "Hi"}], 8)[-40:]  # window of 128
    with_cache = greedy_ids(loaded, ids)
    without = greedy_ids(dataclasses.replace(loaded, supports_kv_cache=False), ids)
    assert with_cache == without


def test_nanogpt_checkpoint_dict(tmp_path, gpt2_ranks):
    model = random_gpt()
    args = dict(dataclasses.asdict(SEED_LIKE), dropout=0.0)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, "model_args": args,
                "iter_num": 10, "best_val_loss": torch.tensor(1.5), "config": {"lr": 1e-3}}, path)
    loaded = load_chat_model(str(path), tokenizer_spec=f"gpt2:{gpt2_ranks}")
    assert "ckpt.pt model_args" in loaded.description
    assert torch.equal(loaded.model.transformer.h[1].mlp.c_fc.weight, model.transformer.h[1].mlp.c_fc.weight)


SAFETENSORS_CONFIG = GPTConfig(block_size=64, vocab_size=264, n_layer=1, n_head=2, n_embd=32)


def save_safetensors(directory, config=SAFETENSORS_CONFIG, tokenizer="byte"):
    directory.mkdir(parents=True, exist_ok=True)
    model = random_gpt(config)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**dataclasses.asdict(config), "tokenizer": tokenizer}))
    return directory / "model.safetensors", model


def test_safetensors_with_config(tmp_path):
    path, model = save_safetensors(tmp_path / "m")
    loaded = load_chat_model(str(path))
    assert loaded.tokenizer.name == "byte" and loaded.block_size == 64
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight  # stored once, tied again
    assert loaded.model.lm_head.weight.dtype == torch.float32  # other precisions: tests/chat/model/test_precision.py
    assert "".join(p.text for p in generate(loaded, [256, 65, 66], max_new_tokens=5, temperature=0)) is not None


def test_factory_hook_with_the_example(seed_checkpoint, gpt2_ranks):
    loaded = load_chat_model(str(seed_checkpoint), arch="owner-tiny", factory=EXAMPLE,
                             tokenizer_spec=f"gpt2:{gpt2_ranks}")
    assert loaded.supports_kv_cache and "factory" in loaded.description
    by_shapes = load_chat_model(str(seed_checkpoint), arch=HEADS, tokenizer_spec=f"gpt2:{gpt2_ranks}")
    ids = [50257, 15496, 995, 50260]
    assert greedy_ids(loaded, ids) == greedy_ids(by_shapes, ids)


def test_factory_model_without_cache_runs_full_recompute(seed_checkpoint, gpt2_ranks, tmp_path):
    factory = tmp_path / "plain.py"
    factory.write_text(
        "import torch.nn as nn\n"
        "from examples.owner_chat_model import build_model as _build\n"
        "class Plain(nn.Module):  # only the seed's contract: model(idx) -> (logits, loss), config\n"
        "    def __init__(self, inner):\n"
        "        super().__init__(); self.transformer, self.lm_head, self.config = "
        "inner.transformer, inner.lm_head, inner.config\n"
        "        self._inner = [inner]\n"
        "    def forward(self, idx, targets=None):\n"
        "        return self._inner[0](idx, targets)\n"
        "def build_model(arch):\n"
        "    return Plain(_build(arch))\n")
    plain = load_chat_model(str(seed_checkpoint), arch="owner-tiny", factory=f"{factory}:build_model",
                            tokenizer_spec=f"gpt2:{gpt2_ranks}")
    assert not plain.supports_kv_cache and "full recompute" in plain.description
    cached = load_chat_model(str(seed_checkpoint), arch=HEADS, tokenizer_spec=f"gpt2:{gpt2_ranks}")
    ids = [50257, 15496, 995, 50260]
    assert greedy_ids(plain, ids) == greedy_ids(cached, ids)


# -- an owner checkpoint of a shape no preset has: 2 layers, 4 heads, 128 wide, window 512 ----------

OWNER = GPTConfig(block_size=512, vocab_size=50304, n_layer=2, n_head=4, n_embd=128)
OWNER_ARCH = "n_layer=2,n_head=4,n_embd=128,block_size=512"


@pytest.fixture(scope="module")
def owner(tmp_path_factory):
    """(raw seed-format .pt in a folder of its own, the model it was saved from)."""
    model = random_gpt(OWNER, seed=1)
    path = tmp_path_factory.mktemp("owner") / "chat.pt"
    torch.save({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, path)
    return path, model


def logits_of(model):
    idx = torch.arange(0, 50000, 997).view(1, -1)  # 51 tokens
    with torch.no_grad():
        return model(idx)[0]


@pytest.mark.parametrize("how", ["key=value", "json file", "config.json"])
def test_owner_shape_loads_with_its_heads(owner, tmp_path, how):
    path, original = owner
    arch = OWNER_ARCH
    if how == "json file":
        arch = str(tmp_path / "arch.json")
        (tmp_path / "arch.json").write_text(json.dumps({"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 512,
                                                        "vocab_size": 50304, "bias": True}))
    elif how == "config.json":  # beside the .pt; also names the tokenizer: gpt2 without a path is packaged
        arch = None
        path = tmp_path / "chat.pt"
        path.write_bytes(owner[0].read_bytes())
        (tmp_path / "config.json").write_text(json.dumps({"n_head": 4, "tokenizer": "gpt2", "notes": "kept"}))
    loaded = load_chat_model(str(path), arch=arch, tokenizer_spec=None if arch is None else "gpt2")
    assert loaded.model.config == OWNER and loaded.block_size == 512 and "2L/4H/128d" in loaded.description
    assert loaded.tokenizer.name == "gpt2"
    assert torch.equal(logits_of(loaded.model), logits_of(original))


def test_two_heads_would_give_other_logits(owner):
    """The check above can tell: the same weights read as 2 heads compute something else."""
    path, original = owner
    two = load_chat_model(str(path), arch="n_head=2", tokenizer_spec="byte")
    assert two.model.config.n_head == 2
    assert not torch.allclose(logits_of(two.model), logits_of(original), atol=1e-3)


def test_the_setting_wins_over_config_json(owner, tmp_path):
    path = tmp_path / "chat.pt"
    path.write_bytes(owner[0].read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 2, "n_layer": 2, "tokenizer": "byte"}))
    loaded = load_chat_model(str(path), arch="n_head=4")
    assert loaded.model.config.n_head == 4
    assert "config from GLASSBOX_CHAT_ARCH=n_head=4 + config.json (n_layer) + tensor shapes (" \
        in loaded.description


def test_without_n_head_start_up_says_what_to_set(owner):
    with pytest.raises(ModelLoadError) as err:
        load_chat_model(str(owner[0]), tokenizer_spec="byte")
    message = str(err.value)
    assert "chat.pt" in message and "GLASSBOX_CHAT_ARCH=n_head=" in message
    assert "n_layer=2" in message and "n_embd=128" in message and "block_size=512" in message
    assert "transformer.wte.weight (50304, 128)" in message and "config.json" in message


@pytest.mark.parametrize("arch, complaint", [
    ("n_heads=4", "GLASSBOX_CHAT_ARCH=n_heads=4: unknown key n_heads"),
    ("n_head=four", "GLASSBOX_CHAT_ARCH=n_head=four: bad value n_head='four' (a positive integer)"),
    ("n_head=0", "bad value n_head='0'"),
    ("n_head=4,bias=maybe", "bad value bias='maybe' (true or false)"),
    ("n_head=4,n_layer", "GLASSBOX_CHAT_ARCH=n_head=4,n_layer: expected key=value pairs"),
    ("n_head=4,n_head=2", "each key once"),
    ("n_head=3", "n_embd=128 is not divisible by n_head=3"),
    ("n_layer=3,n_head=4", "missing keys: transformer.h.2."),  # the shapes still check a stated field
    ("no/such/arch.json", "GLASSBOX_CHAT_ARCH=no/such/arch.json: file no/such/arch.json not found"),
])
def test_bad_arch_settings_name_the_variable(owner, arch, complaint):
    with pytest.raises(ModelLoadError) as err:
        load_chat_model(str(owner[0]), arch=arch, tokenizer_spec="byte")
    assert complaint in str(err.value)


def test_bad_json_arch_files(owner, tmp_path):
    bad = tmp_path / "arch.json"
    for text, complaint in [('{"n_head": 4, "heads": 4}', "unknown key heads"), ("[4]", "expected a JSON object"),
                            ("{n_head: 4", "unreadable JSON"), ('{"n_head": 4.5}', "bad value n_head=4.5")]:
        bad.write_text(text)
        with pytest.raises(ModelLoadError, match="arch.json") as err:
            load_chat_model(str(owner[0]), arch=str(bad), tokenizer_spec="byte")
        assert complaint in str(err.value)


def test_not_a_nanogpt_state_dict(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.zeros(4, 4)}, path)
    with pytest.raises(ModelLoadError, match="other.pt: cannot tell .*not a GPT in nanoGPT's layout"):
        load_chat_model(str(path), arch="n_head=4", tokenizer_spec="byte")


def test_bad_value_in_config_json_names_the_file(owner, tmp_path):
    path = tmp_path / "chat.pt"
    path.write_bytes(owner[0].read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"n_head": "4 heads"}))
    with pytest.raises(ModelLoadError, match=r"config.json: bad value n_head='4 heads'"):
        load_chat_model(str(path), tokenizer_spec="byte")


# -- every mismatch stops with a message naming the file ------------------------------------------

def test_missing_checkpoint(tmp_path):
    with pytest.raises(ModelLoadError, match="absent.pt: checkpoint not found"):
        load_chat_model(str(tmp_path / "absent.pt"), tokenizer_spec="byte")


def test_unreadable_checkpoint(tmp_path):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"\x00not a checkpoint" * 10)
    with pytest.raises(ModelLoadError, match="garbage.pt: unreadable"):
        load_chat_model(str(bad), tokenizer_spec="byte")
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="garbage.safetensors: unreadable"):
        load_chat_model(str(bad), tokenizer_spec="byte")


def test_tokenizer_larger_than_embedding(tmp_path, gpt2_ranks):
    path, _ = save_safetensors(tmp_path / "m")
    with pytest.raises(ModelLoadError, match=r"model.safetensors: tokenizer .* needs 50262 ids .* only 264 rows"):
        load_chat_model(str(path), tokenizer_spec=f"gpt2:{gpt2_ranks}")


def test_missing_and_unknown_keys(tmp_path, seed_checkpoint):
    state = torch.load(seed_checkpoint)
    del state["_orig_mod.transformer.h.1.mlp.c_fc.bias"]
    state["extra.weight"] = torch.zeros(2)
    path = tmp_path / "broken.pt"
    torch.save(state, path)
    with pytest.raises(ModelLoadError) as err:
        load_chat_model(str(path), arch="owner-tiny", factory=EXAMPLE, tokenizer_spec="byte")
    message = str(err.value)
    assert "broken.pt" in message and "missing keys: transformer.h.1.mlp.c_fc.bias" in message
    assert "unexpected keys: extra.weight" in message


def test_wrong_shapes(seed_checkpoint):
    with pytest.raises(ModelLoadError) as err:
        load_chat_model(str(seed_checkpoint), arch="gpt2", tokenizer_spec="byte")
    message = str(err.value)
    assert "model.pt" in message and "preset gpt2" in message
    assert "shape of transformer.wpe.weight: model expects (1024, 768), checkpoint has (128, 128)" in message


def test_unknown_arch_and_bad_factory(seed_checkpoint):
    with pytest.raises(ModelLoadError, match="unknown arch 'gpt5'"):
        load_chat_model(str(seed_checkpoint), arch="gpt5", tokenizer_spec="byte")
    with pytest.raises(ModelLoadError, match="cannot be imported"):
        load_chat_model(str(seed_checkpoint), factory="no_such_module:build", tokenizer_spec="byte")
    with pytest.raises(ModelLoadError, match="failed for arch 'gpt5'.*unknown arch"):
        load_chat_model(str(seed_checkpoint), factory=EXAMPLE, arch="gpt5", tokenizer_spec="byte")
    with pytest.raises(ModelLoadError, match="module:function"):
        load_chat_model(str(seed_checkpoint), factory="no_colon", tokenizer_spec="byte")


def test_no_tokenizer_named(seed_checkpoint):
    with pytest.raises(ModelLoadError, match="model.pt: no tokenizer named"):
        load_chat_model(str(seed_checkpoint))


def test_untied_head_is_refused(tmp_path, seed_checkpoint):
    state = torch.load(seed_checkpoint)
    state["_orig_mod.lm_head.weight"] = state["_orig_mod.lm_head.weight"].clone() + 1
    path = tmp_path / "untied.pt"
    torch.save(state, path)
    with pytest.raises(ModelLoadError, match="untied.pt: lm_head.weight differs"):
        load_chat_model(str(path), arch=HEADS, tokenizer_spec="byte")


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux's /proc")
def test_a_served_model_reads_its_weights_from_ordinary_memory_not_the_mapped_file(tmp_path):
    """safetensors maps the file; parameters left on that mapping decode slower (issue #10). The app's
    loader (meta device + assign) must give the model its own copies."""
    from tests.support.chat_models import tiny_checkpoint
    from webapp.chat.boot import load_model
    from webapp.config import Settings
    checkpoint = tiny_checkpoint(tmp_path / "chat")
    loaded = load_model(Settings(chat_checkpoint=str(checkpoint)))  # the app's own GPT, built on meta
    mapped = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.rstrip().endswith(str(checkpoint)):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            mapped.append((start, end))
    pointers = [p.data_ptr() for p in loaded.model.parameters()]
    assert not [p for p in pointers if any(a <= p < b for a, b in mapped)]
