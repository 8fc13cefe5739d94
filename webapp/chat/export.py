"""Export the chat model for other engines:

    python -m webapp.chat.export hf OUT_DIR [--force]                      # transformers, vLLM
    python -m webapp.chat.export gguf OUT.gguf [--outtype f32|f16|q8_0] [--force]   # llama.cpp

The model is loaded exactly as the app loads it (the GLASSBOX_CHAT_* settings, docs/configuration.md), on the CPU in
float32, and written by webapp/chat/model/hf.py or webapp/chat/model/gguf.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.gguf import OUTTYPES, export_gguf
from webapp.chat.model.hf import ExportError, export_hf
from webapp.chat.model.loading import load_chat_model
from webapp.config import ConfigError, Settings

NAME_MAX = 255  # bytes in one file name, on the file systems this runs on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.chat.export",
                                     description="Export the chat model that the GLASSBOX_CHAT_* settings load.")
    parser.add_argument("format", choices=["hf", "gguf"],
                        help="hf: a Hugging Face GPT-2 model directory; gguf: one GGUF file for llama.cpp")
    parser.add_argument("out", type=Path, help="hf: the directory; gguf: the file")
    parser.add_argument("--outtype", choices=OUTTYPES, default="f16", help="gguf: the matrices' type (f16)")
    parser.add_argument("--force", action="store_true", help="write into a directory that is not empty, or "
                        "over a file that exists")
    args = parser.parse_args(argv)
    out: Path = args.out
    try:
        refused = where_refused(args.format, out, args.force)
    except OSError as error:  # a path the system cannot look at (a folder it may not read, ...)
        refused = f"{out}: {error.strerror or error}"
    if refused:
        print(f"cannot export: {refused}", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env()
        loaded = load_chat_model(settings.chat_checkpoint, arch=settings.chat_arch or None,
                                 tokenizer_spec=settings.chat_tokenizer or None,
                                 factory=settings.chat_factory or None, device="cpu", dtype=torch.float32)
        if args.format == "gguf":
            written = [export_gguf(loaded, out, args.outtype)]
        else:
            written = export_hf(loaded, out)
    except (ConfigError, ModelLoadError, ExportError, OSError) as error:
        print(f"cannot export: {error}", file=sys.stderr)
        return 1
    print(f"{loaded.description}\nwrote {len(written)} file{'s' if len(written) != 1 else ''} to {out}:")
    for path in written:
        print(f"  {path.name}")
    return 0


def where_refused(fmt: str, out: Path, force: bool) -> str | None:
    """Why `out` cannot take the export (None: it can). Raises OSError for a path the system cannot read."""
    if fmt == "gguf" and out.name in ("", ".", ".."):
        return f"{str(out)!r} is not a file name; give the GGUF file's name (model.gguf)"
    too_long = next((part for part in out.parts if len(part.encode()) > NAME_MAX), None)
    if too_long is not None:
        return f"a name in {str(out)[:80]!r}... is longer than {NAME_MAX} bytes"
    if fmt == "hf" and out.exists() and not out.is_dir():
        return f"{out} is a file; hf writes a directory"
    if fmt == "gguf" and out.is_dir():
        return f"{out} is a directory; gguf writes one file (give its name)"
    if fmt == "hf" and out.is_dir() and any(out.iterdir()) and not force:
        return f"{out} is not empty; give --force to write into it"
    if fmt == "gguf" and out.exists() and not force:
        return f"{out} exists; give --force to write over it"
    return None


if __name__ == "__main__":
    sys.exit(main())
