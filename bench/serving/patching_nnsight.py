"""nnsight's side of bench.serving.patching, run in its own environment (a venv with nnsight and the same torch):
reads {"hf", "clean", "corrupted", "chosen", "against", "threads", "sample", "batch"} as JSON on stdin, prints the
timings and the map as one JSON line, in the shape patching_tl.py prints. nnsight's own idiom: the clean run's
activations saved in one trace, then each cell a patched invoke of the corrupted context, `batch` invokes to a
trace (nnsight runs a trace's invokes as one batch): the residual stream entering each block (the block's input)
at each position, the last block's output at each position, and each head's share of the attention output (the
input of `attn.c_proj`, that head's columns) at every position. Imports nothing of Glassbox."""

from __future__ import annotations

import json
import sys
import time

import torch
from nnsight import LanguageModel


def main() -> None:
    spec = json.loads(sys.stdin.read())
    torch.set_num_threads(spec["threads"])
    lm = LanguageModel(spec["hf"], dispatch=True)
    lm._module.eval()
    blocks = lm.transformer.h
    L, nh = len(lm._module.transformer.h), lm._module.config.n_head
    hs = lm._module.config.n_embd // nh
    chosen, against, batch = spec["chosen"], spec["against"], spec["batch"]
    clean, corrupted = torch.tensor([spec["clean"]]), torch.tensor([spec["corrupted"]])
    T = clean.shape[1]
    cells = [("r", layer, p) for layer in range(L + 1) for p in range(T)] + [
        ("h", layer, h) for layer in range(L) for h in range(nh)]
    every = max(1, len(cells) // spec["sample"]) if spec.get("sample") else 1
    picked = cells[::every]

    with torch.inference_mode():
        started = time.perf_counter()
        entering, heads_in = [], []
        with lm.trace(clean):  # each read in the order the model runs them (nnsight's rule)
            for layer in range(L):
                entering.append(blocks[layer].input.save())
                heads_in.append(blocks[layer].attn.c_proj.input.save())
            final = blocks[L - 1].output.save()
            clean_logits = lm.output.logits[0, -1].save()
        with lm.trace(corrupted):
            corrupted_logits = lm.output.logits[0, -1].save()
        m_clean = float(clean_logits[chosen] - clean_logits[against])
        m_corrupted = float(corrupted_logits[chosen] - corrupted_logits[against])
        setup = time.perf_counter() - started

        def patch(cell) -> None:
            kind, layer, at = cell
            if kind == "h":
                columns = slice(at * hs, (at + 1) * hs)
                blocks[layer].attn.c_proj.input[:, :, columns] = heads_in[layer][:, :, columns]
            elif layer < L:
                blocks[layer].input[:, at] = entering[layer][:, at]
            else:
                blocks[L - 1].output[:, at] = final[:, at]

        values: dict[tuple, float] = {}
        first = None
        t0 = time.perf_counter()
        for i in range(0, len(picked), batch):
            group, saved = picked[i:i + batch], []
            with lm.trace() as tracer:
                for cell in group:
                    with tracer.invoke(corrupted):
                        patch(cell)
                        saved.append(lm.output.logits[0, -1].save())
            for cell, logits in zip(group, saved):
                values[cell] = (float(logits[chosen] - logits[against]) - m_corrupted) / (m_clean - m_corrupted)
            first = first or setup + time.perf_counter() - t0
        spent = time.perf_counter() - t0

    residual = [[values.get(("r", layer, p)) for p in range(T)] for layer in range(L + 1)]
    head_map = [[values.get(("h", layer, h)) for h in range(nh)] for layer in range(L)]
    print(json.dumps({"first": first, "total": setup + spent * len(cells) / len(picked), "ran": len(picked),
                      "clean": m_clean, "corrupted": m_corrupted, "residual": residual, "heads": head_map}))


if __name__ == "__main__":
    main()
