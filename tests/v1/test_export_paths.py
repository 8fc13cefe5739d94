"""`python -m webapp.chat.export` on odd paths: refused with one line, never a traceback, before the model
loads; and a failed export leaves nothing behind (no .part file, no half model, no directory it made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webapp.chat.export import main
from webapp.chat.model.gguf import export_gguf
from webapp.chat.model.hf import export_hf
from webapp.chat.model.loading import load_chat_model

BUNDLED = str(Path(__file__).resolve().parents[2] / "models/chat/model.safetensors")


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("cannot export: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_odd_paths_are_refused_with_one_line_before_anything_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a_file = tmp_path / "model.gguf"
    a_file.write_text("an earlier export")
    assert "is a file; hf writes a directory" in refused(capsys, "hf", str(a_file))
    assert "is a file; hf writes a directory" in refused(capsys, "hf", str(a_file), "--force")
    assert "is not a file name" in refused(capsys, "gguf", "")
    assert "is not a file name" in refused(capsys, "gguf", ".")
    assert "is a directory; gguf writes one file" in refused(capsys, "gguf", str(tmp_path))
    assert "longer than 255 bytes" in refused(capsys, "gguf", "x" * 300 + ".gguf")
    assert "longer than 255 bytes" in refused(capsys, "hf", str(tmp_path / ("d" * 256)))
    assert "exists; give --force" in refused(capsys, "gguf", str(a_file))
    assert a_file.read_text() == "an earlier export" and sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


def test_a_failed_hf_export_leaves_nothing_and_an_earlier_one_whole(tmp_path, monkeypatch):
    loaded = load_chat_model(BUNDLED)
    out = tmp_path / "hf"
    export_hf(loaded, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    writes = {"n": 0}
    write_text = Path.write_text

    def fail_on_the_third(self, *args, **kwargs):
        writes["n"] += 1
        if writes["n"] == 3:
            raise OSError(28, "No space left on device")
        return write_text(self, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", fail_on_the_third)
    with pytest.raises(OSError):
        export_hf(loaded, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no .part, the earlier export untouched
    writes["n"] = 0
    with pytest.raises(OSError):
        export_hf(loaded, tmp_path / "new")
    assert not (tmp_path / "new").exists()  # the directory it made is gone too


def test_a_failed_gguf_export_leaves_no_part_file(tmp_path, monkeypatch):
    import gguf
    loaded = load_chat_model(BUNDLED)

    def no_room(self):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", no_room)
    with pytest.raises(OSError):
        export_gguf(loaded, tmp_path / "model.gguf", "f32")
    assert list(tmp_path.iterdir()) == []
