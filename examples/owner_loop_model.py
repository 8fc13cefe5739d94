"""Worked example of plugging your own Loop-lab model into Glassbox.

    GLASSBOX_LOOP_MODEL=examples.owner_loop_model:load

Glassbox imports this module, calls `load()` with no arguments and expects a
LoopBundle, or any object or dict with the same five fields:

  model              called as model(input_ids=..., attention_mask=..., num_loops=...,
                     completion_threshold=..., readout_token_ids=..., loop_callback=...);
                     in eval mode, with a `completion_head` attribute
  tokenizer          tok(text, add_special_tokens=False, return_tensors="pt") -> input_ids, attention_mask
  readout_token_ids  the 26 token ids of A..Z, in order
  checkpoint_id      a string shown with every trace
  render_prompt      callable(pairs, start, steps) -> prompt text

This example builds the project's own architecture through its public classes
and loads the bundled weights into it; an owner with a different architecture
would construct their model and tokenizer here instead.
"""

import hashlib
import json
from pathlib import Path

from safetensors.torch import load_file

from webapp.loops.model.looped import LoopConfig, LoopTransformer
from webapp.loops.model.tokenizer import CharTokenizer
from webapp.loops.task import render_prompt

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "models" / "loops"


def load() -> dict:
    saved = json.loads((WEIGHTS_DIR / "config.json").read_text())
    model = LoopTransformer(LoopConfig(**saved["model"]))
    weights = WEIGHTS_DIR / "model.safetensors"
    model.load_state_dict(load_file(str(weights)))
    model.eval()  # the Loop lab refuses a model in training mode
    tokenizer = CharTokenizer(saved["tokenizer"]["vocab"])
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    return {"model": model, "tokenizer": tokenizer,
            "readout_token_ids": tokenizer.readout_token_ids,
            "checkpoint_id": f"owner-example:loops@{digest}",
            "render_prompt": render_prompt}
