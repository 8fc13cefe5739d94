"""What the decode benchmarks share: random models, the three decoders timed alike, the machine,
and the report (a table on stdout, appended to docs/benchmarks-history.md with date, machine, command,
revision; docs/benchmarks.md's current table is updated by hand from it). Memory bandwidth and the
roofline a decode figure is set against: bench/rooflines.py.

Every decoder is timed the same way: t0 at the call, a timestamp when each new token is known on the
host. Time to first token = first timestamp - t0 (the prefill included); decode tokens/s = (tokens - 1)
/ (last - first timestamp).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks-history.md"  # every run, appended; the current figures: docs/benchmarks.md
GPT2_RANKS = ROOT / "webapp" / "chat" / "model" / "data" / "gpt2.tiktoken"  # packaged GPT-2 ranks
VOCAB = 50257  # GPT-2's real tokens; prompts are drawn from these


# -- models ------------------------------------------------------------------------------------------
def random_gpt(preset: str, seed: int = 0, dtype=torch.float32, device="cpu"):
    """The project's GPT with GPT-2 init, fixed seed (the same weights for every variant)."""
    from webapp.chat.model.gpt import GPT, PRESETS
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(PRESETS[preset])
    return model.to(dtype=dtype).eval()


class NeverStops:
    """GPT-2's tokenizer, except no id ends a reply: random weights would stop at a special id by chance,
    and every decoder must produce exactly the asked number of tokens."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name + "-never-stops"
        self.special_ids = inner.special_ids
        self.n_vocab = inner.n_vocab

    def encode_ordinary(self, text):
        return self.inner.encode_ordinary(text)

    def decode_single_token_bytes(self, token):
        return self.inner.decode_single_token_bytes(token) if token < VOCAB else b""

    def is_special(self, token):
        return False


def gpt2_tokenizer():
    from webapp.chat.model.tokenizer import gpt2_tokenizer as make
    return make(str(GPT2_RANKS))


def loaded(model, tokenizer=None):
    """A LoadedChatModel around `model`, as the loader builds it (GPT-2 tokenizer that never stops)."""
    from webapp.chat.model.loading import LoadedChatModel
    from webapp.chat.model.prompt import PromptBuilder
    tok = tokenizer or NeverStops(gpt2_tokenizer())
    return LoadedChatModel(model=model, tokenizer=tok, block_size=model.config.block_size, supports_kv_cache=True,
                           checkpoint_id="random", description="random weights",
                           prompt=PromptBuilder(tok, model.config.block_size))


def to_hf(model):
    """transformers' GPT2LMHeadModel with the same weights (Conv1D stores Linear weights transposed)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    c = model.config
    cfg = GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                     n_head=c.n_head, activation_function="gelu",  # nanoGPT's exact GELU, not gelu_new
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                     bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
    with torch.device("meta"):
        hf = GPT2LMHeadModel(cfg)
    state = {}
    for k, v in model.state_dict().items():
        transpose = k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        state[k] = (v.t() if transpose else v).contiguous().clone()
    hf.load_state_dict(state, strict=True, assign=True)
    hf.tie_weights()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0  # silences the "no pad token" warning; nothing is padded
    return hf.to(model.lm_head.weight.device).eval()


@torch.inference_mode()
def check_same_logits(model, hf, length=16) -> float:
    """Largest |logit difference| between the two layouts on one random input (should be ~1e-5)."""
    idx = torch.randint(0, VOCAB, (1, length), device=model.lm_head.weight.device)
    ours = model(idx)[0][:, -1].float()
    theirs = hf(idx).logits[:, -1].float()
    return float((ours - theirs).abs().max())


def prompt_ids(length: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=g).tolist()


# -- the three decoders ----------------------------------------------------------------------------
@dataclass
class Run:
    ttft_s: float  # call -> first new token on the host (prefill included)
    tokens_per_s: float  # decode rate after the first token
    new_tokens: int
    extra: dict = field(default_factory=dict)


def _run(t0: float, stamps: list[float], **extra) -> Run:
    n = len(stamps)
    rate = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else float("nan")
    return Run(stamps[0] - t0, rate, n, extra)


def glassbox(loaded_model, ids, new_tokens, top_k=50, seed=0, prefix_cache=None) -> Run:
    """webapp.chat.decode.generate.generate as the chat service drives it."""
    from webapp.chat.decode.generate import generate
    stamps, tokens, stats = [], [], None
    t0 = time.perf_counter()
    for piece in generate(loaded_model, ids, max_new_tokens=new_tokens, top_k=top_k, seed=seed,
                          prefix_cache=prefix_cache):
        if piece.stats is None:
            stamps.append(time.perf_counter())
            tokens.append(piece.token)
        else:
            stats = piece.stats
    return _run(t0, stamps, reused=stats.reused_tokens, tokens=tokens)


def seed_loop(model, ids, new_tokens, top_k=50, seed=0) -> Run:
    """The owner's server loop (seeds/chat_server_inference.py): every token runs the whole cropped
    sequence again under no_grad, softmax, top-k, multinomial, .item(), torch.cat. The stop check at
    ids >= 50257 is left out so that every run makes exactly `new_tokens`."""
    torch.manual_seed(seed)
    device = model.lm_head.weight.device
    block = model.config.block_size
    stamps = []
    t0 = time.perf_counter()
    x = torch.tensor(ids, dtype=torch.long, device=device).unsqueeze(0)
    for _ in range(new_tokens):
        with torch.no_grad():
            logits, _ = model(x[:, -block:])
            probs = F.softmax(logits[:, -1, :], dim=-1)
            top_probs, top_idx = torch.topk(probs, top_k, dim=-1)
            next_id = torch.gather(top_idx, -1, torch.multinomial(top_probs, 1))
        next_id.item()
        stamps.append(time.perf_counter())
        x = torch.cat((x, next_id), dim=1)
    return _run(t0, stamps)


class _Stamps:
    """A transformers streamer that only notes when each new token arrives (the first put is the prompt)."""

    def __init__(self):
        self.stamps = []
        self.seen_prompt = False

    def put(self, value):
        if self.seen_prompt:
            self.stamps.append(time.perf_counter())
        self.seen_prompt = True

    def end(self):
        pass


def hf_generate(hf, ids, new_tokens, top_k=50, seed=0) -> Run:
    """transformers' generate: KV cache, top-k 50 sampling, exactly new_tokens (no eos)."""
    torch.manual_seed(seed)
    streamer = _Stamps()
    x = torch.tensor([ids], dtype=torch.long, device=hf.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=True, top_k=top_k, top_p=1.0,
                          temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          streamer=streamer)
    assert out.shape[1] == len(ids) + new_tokens, out.shape
    return _run(t0, streamer.stamps)


# -- the machine -------------------------------------------------------------------------------------
def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# the instruction sets a decode kernel is built for, by their /proc/cpuinfo flags, in the order they are named
VECTOR_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "bf16", "avx512_vnni": "VNNI", "amx_tile": "AMX"}


def cpu_description(cpuinfo: str) -> str:
    """One CPU of /proc/cpuinfo as the history names it: the model name (a VM's is often only the vendor's
    line, "AMD EPYC"), its family and model, which tell two CPUs of one name apart, and the vector
    instructions the kernels use."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    vector = ", ".join(label for flag, label in VECTOR_FLAGS.items() if flag in flags)
    has_ids = "cpu family" in fields and "model" in fields
    ids = f"family {fields['cpu family']}, model {fields['model']}" if has_ids else ""
    details = "; ".join(part for part in (ids, vector) if part)
    return f"{name} ({details})" if details else name


def machine() -> str:
    try:
        cpu = cpu_description(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = platform.processor() or platform.machine()
    if torch.cuda.is_available():
        cpu += f"; GPU {torch.cuda.get_device_name(0)}"
    return f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} torch threads"


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def revision() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "webapp", "bench")
    return rev + ("+uncommitted changes" if dirty else "")


@contextlib.contextmanager
def native_harness(source: Path, *flags: str) -> Iterator[Path]:
    """A bench's C harness compiled for this CPU (cc -march=native and flags) in a folder removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / source.stem
        # the flags after the source: a library (-lm) named before it would not be linked for it
        subprocess.run(["cc", "-march=native", "-o", str(binary), str(source), *flags], check=True)
        yield binary


def median(xs):
    xs = [x for x in xs if x == x]  # drop NaN
    return statistics.median(xs) if xs else float("nan")


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", "-m", _module_name()] + sys.argv[1:])


def _module_name() -> str:
    main = Path(sys.argv[0]).resolve()
    try:
        return ".".join(main.relative_to(ROOT).with_suffix("").parts)
    except ValueError:
        return str(main)


def table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return "n/a" if v != v else (f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}")
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report(title: str, body: str, *, load_before: str, write_doc: bool = True) -> None:
    """Print, and append a dated section to docs/benchmarks-history.md (other sections are never touched)."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    section = (f"\n## {title} ({stamp})\n\n"
               f"- command: `{command_line()}`\n- revision: {revision()}\n- machine: {machine()}\n"
               f"- load average (1/5/15 min) before: {load_before}, after: {load_average()}\n\n{body}\n")
    print(section)
    if write_doc:
        if not DOC.exists():
            DOC.write_text("# Benchmark history\n\nEvery section was appended by the command it names "
                           "(the current figures: docs/benchmarks.md).\n")
        with open(DOC, "a") as f:
            f.write(section)
