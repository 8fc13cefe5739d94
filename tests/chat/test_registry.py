"""GLASSBOX_CHAT_MODELS: the registry file read, each model's own settings, and a clear refusal naming the
file, the table and the key for every file that cannot be used."""

from __future__ import annotations

import pytest

from tests.support.chat_models import tiny_checkpoint
from webapp.chat import boot
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.registry import DEFAULT_NAME, ChatModels, ModelRecord, Work, model_entries
from webapp.config import ConfigError, Settings


def registry(tmp_path, text: str) -> Settings:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return Settings(chat_models=str(path))


def test_without_a_registry_the_single_model_settings_make_a_registry_of_one():
    settings = Settings(chat_checkpoint="/m/x.pt", chat_tokenizer="gpt2", dtype="bfloat16")
    [entry] = model_entries(settings)
    assert entry.name == DEFAULT_NAME and entry.settings is settings


def test_each_table_is_a_model_in_order_with_its_own_settings(tmp_path):
    settings = registry(tmp_path, """
[models.tiny]
checkpoint = "models/chat/model.safetensors"
[models.gpt2-254m]
checkpoint = "/models/chat_254m.pt"
arch = "gpt2-254m"
tokenizer = "gpt2"
dtype = "bfloat16"
torch_threads = 2
backend_timeout = 5
""")
    settings = Settings(**{**settings.__dict__, "chat_tokenizer": "byte", "chat_arch": "gpt2"})
    tiny, big = model_entries(settings)
    assert (tiny.name, big.name) == ("tiny", "gpt2-254m")
    # relative paths from the file's folder; nothing of the single-model settings leaks into a model
    assert tiny.settings.chat_checkpoint == str(tmp_path / "models/chat/model.safetensors")
    assert (tiny.settings.chat_tokenizer, tiny.settings.chat_arch, tiny.settings.dtype) == ("", "", "")
    assert (big.settings.chat_checkpoint, big.settings.chat_arch, big.settings.chat_tokenizer) == (
        "/models/chat_254m.pt", "gpt2-254m", "gpt2")
    assert (big.settings.dtype, big.settings.chat_torch_threads, big.settings.chat_backend_timeout) == (
        "bfloat16", 2, 5.0)


@pytest.mark.parametrize("text, names", [
    ("[models.a]\ncheckpoint = 'x'\nfactroy = 'm:f'\n", ["[models.a]", "'factroy'", "unknown"]),
    ("[models.a]\ncheckpoint = 3\n", ["[models.a]", "'checkpoint'", "expected a string"]),
    ("[models.a]\ncheckpoint = 'x'\ntorch_threads = 'two'\n", ["[models.a]", "'torch_threads'", "an integer"]),
    ("[models.a]\narch = 'gpt2'\n", ["[models.a]", "no checkpoint"]),
    ("[models.'a b']\ncheckpoint = 'x'\n", ["[models.a b]", "name"]),
    ("[models]\n", ["no models"]),
    ("[model.a]\ncheckpoint = 'x'\n", ["unknown table [model]"]),
    ("[models.a\ncheckpoint = 'x'\n", ["not valid TOML"]),
    # every number is checked as its GLASSBOX_* twin is (100,000,000 threads made the worker crash in a loop)
    ("[models.a]\ncheckpoint = 'x'\ntorch_threads = 100000000\n", ["'torch_threads'", "out of range", "1 to 256"]),
    ("[models.a]\ncheckpoint = 'x'\ntorch_threads = -1\n", ["'torch_threads'", "-1 is out of range"]),
    ("[models.a]\ncheckpoint = 'x'\nbackend_timeout = 0\n", ["'backend_timeout'", "0.1 to 3600"]),
    ("[models.a]\ncheckpoint = 'x'\nbackend_max_replies = 0\n", ["'backend_max_replies'", "out of range"]),
    ("[models.a]\ncheckpoint = 'x'\nbackend_wait_seconds = nan\n", ["'backend_wait_seconds'", "out of range"]),
])
def test_a_file_that_cannot_be_used_is_refused_naming_the_file_the_table_and_the_key(tmp_path, text, names):
    settings = registry(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        model_entries(settings)
    message = str(refused.value)
    assert f"GLASSBOX_CHAT_MODELS={tmp_path / 'models.toml'}" in message
    for name in names:
        assert name in message


def test_a_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="models.toml: cannot read the file"):
        model_entries(Settings(chat_models=str(tmp_path / "models.toml")))


def test_a_model_that_does_not_load_stops_start_up_naming_its_table(tmp_path):
    tiny_checkpoint(tmp_path / "a")
    settings = registry(tmp_path, "[models.a]\ncheckpoint = 'a/model.safetensors'\n"
                                  "[models.b]\ncheckpoint = 'b/missing.safetensors'\n")
    with pytest.raises(ModelLoadError, match=r"\[models\.b\]: .*missing.safetensors: checkpoint not found"):
        boot.load_models(settings)


def test_a_registry_that_would_not_fit_in_free_memory_is_refused_before_loading(tmp_path, monkeypatch):
    """Each model is held whole in this one process: 100 of them took 2 GB before anything said why (issue 52).
    The machine's free memory is made small here; the checkpoints are real files."""
    tiny_checkpoint(tmp_path / "a")
    tiny_checkpoint(tmp_path / "b", seed=2)
    settings = registry(tmp_path, "[models.a]\ncheckpoint = 'a/model.safetensors'\n"
                                  "[models.b]\ncheckpoint = 'b/model.safetensors'\n")
    size = sum((tmp_path / name / "model.safetensors").stat().st_size for name in "ab")
    loads = []
    monkeypatch.setattr(boot, "load_model", lambda s: loads.append(s))  # never reached: refused first
    monkeypatch.setattr(boot, "available_memory", lambda: size - 1)
    with pytest.raises(ModelLoadError, match=r"models.toml: its 2 checkpoints take 0\.0 GiB.*free: run fewer models"):
        boot.load_models(settings)
    assert loads == []
    monkeypatch.undo()
    monkeypatch.setattr(boot, "available_memory", lambda: size)  # fits exactly: loaded
    assert boot.load_models(settings).names() == ["a", "b"]


def test_loaded_models_keep_their_order_kinds_and_records(tmp_path):
    tiny_checkpoint(tmp_path / "a", seed=1)
    tiny_checkpoint(tmp_path / "b", seed=2)
    settings = registry(tmp_path, "[models.a]\ncheckpoint = 'a/model.safetensors'\n"
                                  "[models.b]\ncheckpoint = 'b/model.safetensors'\ndtype = 'bfloat16'\n")
    models = boot.load_models(settings)
    assert models.names() == ["a", "b"] and models.default == "a"
    assert (models.kind("a"), models.kind("b")) == ("chat", "chat:b")
    assert (models.job_kind(Work.INSIDE, "a"), models.job_kind(Work.INSIDE, "b")) == ("inside", "inside:b")
    assert (models.job_kind(Work.ATTRIBUTION, "a"), models.job_kind(Work.ATTRIBUTION, "b")) == ("attribution",
                                                                                                "attribution:b")
    b = models.record("b")
    assert b.precision == "bfloat16" and b.file_id.startswith("model.safetensors@")
    assert b.file_id != models.record("a").file_id  # other weights, another id
    assert models.unavailable(b) is None and models.unavailable(None) is None


def test_a_reply_by_a_model_not_run_or_from_another_file_is_said_so(tmp_path):
    tiny_checkpoint(tmp_path / "a")
    models = ChatModels.one(boot.load_model(Settings(chat_checkpoint=str(tmp_path / "a/model.safetensors"))), "a")
    assert models.unavailable(ModelRecord("gpt2-254m", "x@1", "float32")) == (
        "This reply was written by gpt2-254m, which this server does not run.")
    changed = models.unavailable(ModelRecord("a", "model.safetensors@000000000000", "float32"))
    assert changed is not None and "from model.safetensors@000000000000" in changed
    assert "another model's" in changed


def test_the_example_registry_names_the_bundled_model_twice():
    from pathlib import Path

    from tests.conftest import ROOT
    tiny, int8 = model_entries(Settings(chat_models=str(ROOT / "examples" / "models.toml")))
    assert (tiny.name, int8.name, int8.settings.dtype) == ("tiny", "tiny-int8", "int8")
    assert Path(tiny.settings.chat_checkpoint).resolve() == (ROOT / "models/chat/model.safetensors").resolve()
    assert Path(int8.settings.chat_checkpoint).is_file()
