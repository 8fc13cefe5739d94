"""bench.peers.llamacpp's environment, shared by its single-stream and batched benchmarks (bench/peers/llamacpp.py,
bench/peers/llamacpp_batched.py) and by bench.peers.engines: the venv with llama-cpp-python built from source under
.bench/llamacpp/, the GGUF files of the exported model, and how busy other processes kept the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".bench" / "llamacpp"  # gitignored; nothing here is part of `make test`
VENV = HOME / "venv"
VPY = VENV / "bin" / "python"
LLAMA_CPP_PYTHON = "0.3.36"  # llama-cpp-python, built from source (its sdist vendors llama.cpp)
TORCH = "torch==2.13.0"  # the CPU wheel (pip's find-links); never unpinned: that would pull a CUDA build
TRANSFORMERS = "transformers==5.24.0"  # the converter reads config.json and the tokenizer through it
CMAKE_ARGS = "-DGGML_NATIVE=ON"  # -march=native: this CPU's AVX-512 / avx512_bf16 / VNNI kernels
SDIST = HOME / "sdist"
CONVERTER = HOME / "convert_hf_to_gguf.py"
GGUF_PY = HOME / "gguf-py"
CONVERSION = HOME / "conversion"  # the converter's model classes (it imports this package)
GGUF_TYPES = ("f32", "f16", "q8_0")


# -- the bench environment ---------------------------------------------------------------------------
def _step(message: str) -> None:
    print(f"[llamacpp setup] {message}", flush=True)


def _run(cmd: list, log: Path | None = None, env: dict | None = None) -> None:
    print("  $ " + " ".join(str(c) for c in cmd), flush=True)
    if log is None:
        subprocess.run([str(c) for c in cmd], check=True, env=env)
        return
    with open(log, "w") as out:
        r = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}); see {log}")



def sdist_tarball(python: Path, folder: Path) -> Path:
    """llama-cpp-python's source distribution in `folder`, downloaded with `python`'s pip when missing."""
    tarball = next(folder.glob("llama_cpp_python-*.tar.gz"), None) if folder.exists() else None
    if tarball is None:
        _step(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist")
        _run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", folder,
              f"llama-cpp-python=={LLAMA_CPP_PYTHON}"])
        tarball = next(folder.glob("llama_cpp_python-*.tar.gz"))
    return tarball

def _venv_has(module: str, attr: str = "__version__") -> str | None:
    r = subprocess.run([str(VPY), "-c", f"import {module}; print({module}.{attr})"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def setup(converter: bool = True) -> None:
    """Create .bench/llamacpp (venv, sdist, converter, gguf-py, llama-cpp-python); skip what is done. Without
    `converter` (GGUF files written by Glassbox's own writer, --gguf-writer glassbox) only the venv with
    llama-cpp-python: a copy of another bench's venv that has it (.bench/engines/venv) is then enough."""
    HOME.mkdir(parents=True, exist_ok=True)
    pip = [VPY, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if not VPY.exists():
        _step(f"creating the bench venv {VENV}")
        _run([sys.executable, "-m", "venv", VENV])
    version = _venv_has("torch") if converter else "not needed"
    if version is None:
        _step(f"installing {TORCH} first (the converter imports torch)")
        _run(pip + [TORCH])
        version = _venv_has("torch")
    if converter and (not version or not version.startswith("2.13.0+cpu")):
        raise SystemExit(f"the bench venv has torch {version!r}, not the 2.13.0 CPU wheel")
    if converter and (_venv_has("transformers") is None or _venv_has("yaml", "__name__") is None):
        _step("installing the converter's other needs (numpy, safetensors, transformers, pyyaml, tqdm)")
        _run(pip + ["numpy", "safetensors", TRANSFORMERS, "pyyaml", "tqdm"])
    tarball = sdist_tarball(VPY, SDIST)
    if converter and not (CONVERTER.exists() and GGUF_PY.exists() and CONVERSION.exists()):
        _step(f"extracting vendor/llama.cpp/{{convert_hf_to_gguf.py,conversion,gguf-py}} from {tarball.name}")
        with tarfile.open(tarball) as tar:
            top = tar.getnames()[0].split("/")[0]
            vendor = f"{top}/vendor/llama.cpp/"
            for m in tar.getmembers():
                if m.name == vendor + "convert_hf_to_gguf.py" or m.name.startswith(
                        (vendor + "gguf-py/", vendor + "conversion/")):
                    m.name = m.name[len(vendor):]
                    tar.extract(m, HOME, filter="data")
    if converter and _venv_has("gguf", "__name__") is None:
        _step("installing gguf-py from the sdist (no deps: sentencepiece is not needed for GPT-2)")
        _run(pip + ["--no-deps", GGUF_PY])
    if _venv_has("llama_cpp") != LLAMA_CPP_PYTHON:
        log = HOME / "build.log"
        _step(f"building llama-cpp-python {LLAMA_CPP_PYTHON} from source, CMAKE_ARGS={CMAKE_ARGS!r} "
              f"(~9 min on 2 cores; log: {log})")
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        t = time.perf_counter()
        _run([VPY, "-m", "pip", "install", "-v", "--no-binary", "llama-cpp-python", tarball], log=log, env=env)
        _step(f"built in {(time.perf_counter() - t) / 60:.1f} min")
    _step(f"ready: llama-cpp-python {_venv_has('llama_cpp')}, torch {version}")


def export_and_convert(size: str, model, writer: str = "llamacpp") -> dict[str, Path]:
    """The random model as an HF GPT-2 directory (webapp.chat.model.hf) and its GGUF files, made by
    llama.cpp's own converter; cached under .bench/llamacpp/models/SIZE, made again only if missing. With
    writer "glassbox", the GGUF files are written in this process by webapp.chat.model.gguf (llama.cpp's
    gguf-py, the same tensors and quantization; no converter environment needed)."""
    from bench import common
    from webapp.chat.model import hf as export
    out = HOME / "models" / size
    if writer == "glassbox":
        from webapp.chat.model.gguf import export_gguf
        out.mkdir(parents=True, exist_ok=True)
        written = {}
        for outtype in GGUF_TYPES:
            path = out / f"{size}-{outtype}-glassbox.gguf"
            if not path.exists():
                _step(f"writing GGUF {outtype} with webapp.chat.model.gguf")
                export_gguf(common.loaded(model, tokenizer=common.gpt2_tokenizer()), path, outtype)
            written[outtype] = path
        return written
    hf = out / "hf"
    if not (hf / "model.safetensors").exists() or not (hf / "config.json").exists():
        _step(f"exporting the random {size} (seed 0) with the GPT-2 BPE tokenizer to {hf}")
        export.export_hf(common.loaded(model, tokenizer=common.gpt2_tokenizer()), hf)
    paths = {}
    for outtype in GGUF_TYPES:
        path = out / f"{size}-{outtype}.gguf"
        if not path.exists():
            _step(f"converting to GGUF {outtype}")
            tmp = path.with_suffix(".part")
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            env.pop("NO_LOCAL_GGUF", None)  # the gguf-py beside the converter: the same llama.cpp revision
            _run([VPY, CONVERTER, hf, "--outtype", outtype, "--outfile", tmp], log=out / f"convert-{outtype}.log",
                 env=env)
            tmp.rename(path)
        paths[outtype] = path
    return paths


# -- llama.cpp, in the bench venv ------------------------------------------------------------------------
# Runs as `VPY -c WORKER GGUF THREADS N_CTX`: loads once, then answers one JSON line per request line
# ({"ids": [...], "new": N, "logits": bool}) with the timings and the greedy tokens. It imports only
# llama_cpp and numpy (never the project). llama.cpp's own prints go to stderr: the protocol keeps the


# -- other processes' CPU use, from /proc (the machine is shared) ----------------------------------------
HZ = os.sysconf("SC_CLK_TCK")


def _machine_busy() -> int:
    """Jiffies all CPUs spent running something of this machine, from boot: user, nice, system, irq,
    softirq (guest is inside user; idle, iowait and the hypervisor's steal are left out)."""
    user, nice, system, idle, iowait, irq, softirq = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8])
    return user + nice + system + irq + softirq


def _process_cpu(pid: int | str) -> int:
    """Jiffies of user + system time of a process (all its threads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class OtherLoad:
    """Cores that processes other than this benchmark (itself and its workers) kept busy over an interval."""

    def __init__(self, pids=()):
        self.pids = ["self", *pids]

    def start(self):
        self.t, self.busy, self.ours = time.perf_counter(), _machine_busy(), sum(map(_process_cpu, self.pids))

    def cores(self) -> float:
        wall = time.perf_counter() - self.t
        others = (_machine_busy() - self.busy) - (sum(map(_process_cpu, self.pids)) - self.ours)
        return max(0.0, others / HZ / wall)


class JsonWorker:
    """A script run by the bench venv's Python (`VPY -c script args`) that answers one JSON line per JSON line
    it is sent; its first line (what it loaded) is `info`. `first` is sent before that, when given."""

    def __init__(self, script: str, args: list, first: object = None):
        self.proc = subprocess.Popen([str(VPY), "-c", script, *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if first is not None:
            self._send(first)
        self.info = self._read()

    def _send(self, message: object) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited ({self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self._send(request)
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
