"""What two 254M chat models cost in RAM, at each precision: the process's resident memory before loading,
after one model and after two, each precision in a fresh process.

    .venv/bin/python -m bench.memory.two_models                      # gpt2-254m; float32, bfloat16, int8
    .venv/bin/python -m bench.memory.two_models --size gpt2 --precisions int8 --no-doc

One random-weight checkpoint of the preset (GPT-2 init, seed 0, tied head stored once, as
bench.serving.served writes it) is written to a temporary folder as safetensors. Then, per precision, a
fresh Python process imports the loader, reads its own /proc/self/status and loads that checkpoint
through the app's loader (webapp.chat.model.loading.load_chat_model, GPT-2's tokenizer) once, then a
second time while keeping the first, then asks glibc to hand back the memory it keeps free
(malloc_trim). Reported per step: VmRSS (resident now), RssAnon (the part that is not file pages), VmHWM
(the peak so far), and the bytes of one loaded model's tensors (parameters and buffers, each storage
counted once).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import common

PRECISIONS = ["float32", "bfloat16", "int8"]
STATUS_FIELDS = ("VmRSS", "RssAnon", "VmHWM")


def status_mib() -> dict:
    """This process's VmRSS, RssAnon and VmHWM in MiB (/proc reports kB)."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            found[key] = int(value.split()[0]) / 1024
    return found


def tensor_bytes(model) -> int:
    """Bytes of a model's parameters and buffers; a storage shared by two names (a tied head) counts once."""
    import torch

    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if isinstance(t, torch.Tensor) and not t.is_meta:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def child(checkpoint: str, size: str, precision: str) -> None:
    """Load the checkpoint once, then again beside it, in this fresh process; print one JSON line."""
    from webapp.chat.model.loading import load_chat_model

    steps = {"before": status_mib()}
    first = load_chat_model(checkpoint, arch=size, tokenizer_spec="gpt2", dtype=precision)
    steps["one model"] = status_mib()
    second = load_chat_model(checkpoint, arch=size, tokenizer_spec="gpt2", dtype=precision)
    steps["two models"] = status_mib()
    # What the allocator keeps of the freed float32 copies (the checkpoint's clone, the weights before
    # their precision) shows up in RSS; handing it back to the system tells it apart from the models.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    steps["two models, trimmed"] = status_mib()
    print(json.dumps({"precision": precision, "steps": steps,
                      "model_mib": tensor_bytes(first.model) / 2**20, "description": first.description}))
    del first, second


def write_checkpoint(folder: Path, size: str) -> Path:
    from safetensors.torch import save_file

    model = common.random_gpt(size, seed=0)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    path = folder / "model.safetensors"
    save_file(state, str(path))
    return path


def measure(checkpoint: Path, size: str, precision: str) -> dict:
    cmd = [sys.executable, "-m", "bench.memory.two_models", "--child", precision,
           "--checkpoint", str(checkpoint), "--size", size]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def body_for(results: list[dict], checkpoint_mib: float) -> str:
    rows = []
    for r in results:
        s = r["steps"]
        rows.append([r["precision"], f"{r['model_mib']:.0f}",
                     *(f"{s[step]['VmRSS']:.0f}" for step in ("before", "one model", "two models")),
                     f"{s['two models']['VmRSS'] - s['before']['VmRSS']:.0f}",
                     f"{s['two models']['RssAnon'] - s['before']['RssAnon']:.0f}",
                     f"{s['two models, trimmed']['VmRSS'] - s['before']['VmRSS']:.0f}",
                     f"{s['one model']['VmHWM']:.0f}", f"{s['two models']['VmHWM']:.0f}"])
    header = ["precision", "one model's tensors MiB", "RSS before MiB", "RSS one MiB", "RSS two MiB",
              "two models add MiB (RSS)", "two models add MiB (RssAnon)", "two models add MiB after malloc_trim",
              "peak after one MiB",
              "peak after two MiB"]
    return (f"Checkpoint: safetensors, {checkpoint_mib:.0f} MiB (float32, tied head stored once). "
            "Each precision in a fresh process; \"before\" is after importing torch and the loader.\n\n"
            + common.table(header, rows) + "\n\n" + "\n".join(f"- {r['precision']}: {r['description']}"
                                                           for r in results))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.memory.two_models", description=__doc__.split("\n")[0])
    p.add_argument("--size", default="gpt2-254m", help="a preset of webapp/chat/model/gpt.py")
    p.add_argument("--precisions", nargs="+", default=PRECISIONS, choices=PRECISIONS)
    p.add_argument("--no-doc", action="store_true", help="print only; do not append to the benchmark history")
    p.add_argument("--child", choices=PRECISIONS, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.checkpoint, args.size, args.child)
        return
    load_before = common.load_average()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_checkpoint(Path(tmp), args.size)
        results = [measure(checkpoint, args.size, precision) for precision in args.precisions]
        checkpoint_mib = checkpoint.stat().st_size / 2**20
    common.report(f"bench.memory.two_models: two {args.size} chat models in one process",
                  body_for(results, checkpoint_mib), load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
