"""Export the chat model for other engines:

    python -m webapp.chat.export hf OUT_DIR [--force]

The model is loaded exactly as the app loads it (the GLASSBOX_CHAT_* settings, README.md), on the CPU in
float32, and written by webapp/chat/model/hf.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.hf import ExportError, export_hf
from webapp.chat.model.loading import load_chat_model
from webapp.config import ConfigError, Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.chat.export",
                                     description="Export the chat model that the GLASSBOX_CHAT_* settings load.")
    parser.add_argument("format", choices=["hf"], help="hf: a Hugging Face GPT-2 model directory")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--force", action="store_true", help="write into a directory that is not empty")
    args = parser.parse_args(argv)
    if args.out_dir.exists() and any(args.out_dir.iterdir()) and not args.force:
        print(f"{args.out_dir} is not empty; give --force to write into it", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env()
        loaded = load_chat_model(settings.chat_checkpoint, arch=settings.chat_arch or None,
                                 tokenizer_spec=settings.chat_tokenizer or None,
                                 factory=settings.chat_factory or None, device="cpu", dtype=torch.float32)
        written = export_hf(loaded, args.out_dir)
    except (ConfigError, ModelLoadError, ExportError) as error:
        print(f"cannot export: {error}", file=sys.stderr)
        return 1
    print(f"{loaded.description}\nwrote {len(written)} files to {args.out_dir}:")
    for path in written:
        print(f"  {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
