"""TransformerLens' side of bench.serving.patching, run in its own environment (a venv with transformer_lens
4.3 and the same torch): reads {"hf", "clean", "corrupted", "chosen", "against", "threads", "sample"} as
JSON on stdin, prints the timings and the map as one JSON line. Uses TransformerLens' own patching
helpers (transformer_lens.patching: resid_pre at every layer and position, each head's output `z` at all
positions) on a TransformerBridge booted from the HF export; the final residual's row (not a resid_pre)
is patched with run_with_hooks on the last block's hook_resid_post. Imports nothing of Glassbox."""

from __future__ import annotations

import json
import sys
import time

import pandas as pd
import torch
from transformer_lens import patching
from transformer_lens.model_bridge import TransformerBridge


def main() -> None:
    spec = json.loads(sys.stdin.read())
    torch.set_num_threads(spec["threads"])
    bridge = TransformerBridge.boot_transformers(spec["hf"], device="cpu")
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)  # HF numerics, legacy hooks
    bridge.eval()
    chosen, against = spec["chosen"], spec["against"]
    clean, corrupted = torch.tensor([spec["clean"]]), torch.tensor([spec["corrupted"]])
    L, nh, T = bridge.cfg.n_layers, bridge.cfg.n_heads, clean.shape[1]
    cells = (L + 1) * T + L * nh
    every = max(1, cells // spec["sample"]) if spec.get("sample") else 1

    with torch.inference_mode():
        started = time.perf_counter()
        clean_logits, cache = bridge.run_with_cache(clean)
        m_clean = float(clean_logits[0, -1, chosen] - clean_logits[0, -1, against])
        corrupted_logits = bridge(corrupted)
        m_corrupted = float(corrupted_logits[0, -1, chosen] - corrupted_logits[0, -1, against])

        def metric(logits):
            return (logits[0, -1, chosen] - logits[0, -1, against] - m_corrupted) / (m_clean - m_corrupted)

        setup = time.perf_counter() - started
        spent, ran = 0.0, 0
        residual_cells = [(layer, p) for layer in range(L) for p in range(T)]
        head_cells = [(layer, h) for layer in range(L) for h in range(nh)]
        picked_r = residual_cells[::every]
        picked_h = head_cells[len(residual_cells) % every::every] if every > 1 else head_cells
        t0 = time.perf_counter()
        resid = patching.generic_activation_patch(
            bridge, corrupted, cache, metric, patching.layer_pos_patch_setter, "resid_pre",
            index_df=pd.DataFrame(picked_r, columns=["layer", "pos"]))
        # TransformerLens gives a sweep's cells when it ends: the first are there after the whole resid_pre sweep
        first = setup + (time.perf_counter() - t0) * len(residual_cells) / len(picked_r)
        final = []
        for p in range(T)[::every]:
            def put(x, hook, p=p):
                x[:, p] = cache[f"blocks.{L - 1}.hook_resid_post"][:, p]
                return x
            logits = bridge.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{L - 1}.hook_resid_post", put)])
            final.append(float(metric(logits)))
        heads = patching.generic_activation_patch(
            bridge, corrupted, cache, metric, patching.layer_head_vector_patch_setter, "z",
            index_df=pd.DataFrame(picked_h, columns=["layer", "head"]))
        spent = time.perf_counter() - t0
        ran = len(picked_r) + len(final) + len(picked_h)

    residual = [[None] * T for _ in range(L + 1)]
    for (layer, p), v in zip(picked_r, resid.tolist()):
        residual[layer][p] = v
    for p, v in zip(range(T)[::every], final):
        residual[L][p] = v
    head_map = [[None] * nh for _ in range(L)]
    for (layer, h), v in zip(picked_h, heads.tolist()):
        head_map[layer][h] = v
    print(json.dumps({"first": first, "total": setup + spent * cells / ran, "ran": ran, "clean": m_clean,
                      "corrupted": m_corrupted, "residual": residual, "heads": head_map}))


if __name__ == "__main__":
    main()
