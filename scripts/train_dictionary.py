"""Train the bundled chat model's bundled dictionary (models/chat/dictionaries/resid-2): a TopK dictionary of the
residual stream after block 2, on the model's own synthetic training text (scripts/chat_corpus.py), with
`python -m webapp.features train`, then judged with `python -m webapp.features quality` on text of another seed.
Its figures land in models/chat/dictionaries/resid-2/quality.json and docs/features.md, each feature's density and
top contexts in glassbox_features.json beside it. Run from the
repository root: .venv/bin/python scripts/train_dictionary.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chat_corpus import write_jsonl  # noqa: E402

from webapp.features.__main__ import main  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "models/chat/dictionaries/resid-2"

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        corpus, held_out = Path(folder) / "corpus.jsonl", Path(folder) / "held_out.jsonl"
        write_jsonl(str(corpus), 400_000, seed=1)
        code = main(["train", "--layer", "2", "--width", "2048", "--k", "32", "--tokens", "3000000", "--corpus",
                     str(corpus), "--out", str(OUT), "--seed", "0"])
        if code == 0:  # its figures on text it never trained on (another seed), dead counted over a million tokens
            write_jsonl(str(held_out), 100_000, seed=2)
            code = main(["quality", "--dictionary", str(OUT), "--corpus", str(held_out), "--write"])
    (OUT / "glassbox_training.pt").unlink(missing_ok=True)  # the optimiser's state: not worth committing
    sys.exit(code)
