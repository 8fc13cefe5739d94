"""The rest of issue 33's steady benchmark, measured from outside: what a cookie-less flood of Loop-lab API
runs stores against GLASSBOX_MAX_NEW_BROWSER_BYTES_PER_ADDRESS, how many nonsense settings stop start-up
with one line naming the variable, and what the export command says of odd paths.

    .venv/bin/python -m bench.robustness.steady                  # 40 s of flood, then the walks
    .venv/bin/python -m bench.robustness.steady --seconds 10

(The fairness half is bench.robustness.fairness.)
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import string
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.robustness.hostile_kit import Raw  # noqa: E402
from tests.support.servers import Gunicorn  # noqa: E402
from webapp.config import LIMITS, ConfigError, Settings  # noqa: E402

LIMIT = 2**20  # 1 MiB: what the attack that found the hole used
LETTERS = string.ascii_uppercase


def storage_flood(seconds: float, threads: int) -> dict:
    """Cookie-less 256-step runs from one address, `threads` at a time -> what they stored, against the limit."""
    with tempfile.TemporaryDirectory() as tmp:
        server = Gunicorn(Path(tmp) / "instance", {"GLASSBOX_MAX_NEW_BROWSER_BYTES_PER_ADDRESS": str(LIMIT)}).start()
        statuses: dict[int, int] = {}
        lock, stop = threading.Lock(), threading.Event()

        def flood(n: int) -> None:
            raw = Raw(server.url, "127.0.0.2", keep_cookie=False)
            while not stop.is_set():
                body = json.dumps({"mapping": [[a, LETTERS[(i * 7 + n + 3) % 26]] for i, a in enumerate(LETTERS)],
                                   "start": "A", "steps": 256}).encode()
                status, _, _ = raw.request("POST", "/api/loops/trace", body=body,
                                           headers={"Content-Type": "application/json"}, timeout=120)
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

        workers = [threading.Thread(target=flood, args=(n,), daemon=True) for n in range(threads)]
        for worker in workers:
            worker.start()
        time.sleep(seconds)  # the flood's length: what is measured is what it stored meanwhile
        stop.set()
        for worker in workers:
            worker.join(150)
        server.stop()
        with sqlite3.connect(Path(tmp) / "instance" / "glassbox.sqlite3") as db:
            stored, runs = db.execute("SELECT COALESCE(SUM(LENGTH(snapshot)), 0), COUNT(*) FROM traces "
                                      "WHERE owner LIKE 'api:%'").fetchone()
    return {"statuses": statuses, "stored": stored, "runs": runs, "ratio": stored / LIMIT}


def nonsense_settings() -> dict:
    """Every number setting with values out of range, not finite or not a number -> refused by name or not."""
    numbers = {f"GLASSBOX_{f.name.upper()}": f.name for f in fields(Settings) if type(f.default) in (int, float)}
    tried = refused = 0
    for variable, name in sorted(numbers.items()):
        limit = LIMITS[name]
        for value in ("-1", str(int(limit.high) * 10 + 1), "nan", "inf", "abc"):
            if limit.allows(float(value)) if value not in ("nan", "inf", "abc") else False:
                continue
            tried += 1
            try:
                Settings.from_env({variable: value})
            except ConfigError as error:
                refused += str(error).startswith(f"{variable}={value!r} ") and "\n" not in str(error)
    return {"settings": len(numbers), "tried": tried, "refused_by_name": refused}


def export_paths() -> dict:
    """The export command on odd paths -> how many end with one line, no traceback, nothing left behind."""
    with tempfile.TemporaryDirectory() as tmp:
        a_file = Path(tmp) / "a-file"
        a_file.write_text("x")
        cases = [["hf", str(a_file)], ["hf", str(a_file), "--force"], ["gguf", ""], ["gguf", "."],
                 ["gguf", str(Path(tmp) / ("n" * 300 + ".gguf"))], ["hf", str(Path(tmp) / ("d" * 300))]]
        clean = 0
        for args in cases:
            done = subprocess.run([sys.executable, "-m", "webapp.chat.export", *args], cwd=ROOT, capture_output=True,
                                  text=True, timeout=300)
            said = done.stderr.strip().splitlines()
            left = [p.name for p in Path(tmp).iterdir() if p.name != "a-file"]
            clean += done.returncode != 0 and len(said) == 1 and "Traceback" not in done.stderr and not left
    return {"cases": len(cases), "one_line_nothing_left": clean}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="the storage flood's length")
    parser.add_argument("--threads", type=int, default=4, help="the flood's runs at a time")
    args = parser.parse_args()
    flood = storage_flood(args.seconds, args.threads)
    print(f"cookie-less storage flood, {args.seconds:g} s, {args.threads} at a time from one address, limit "
          f"{LIMIT // 1024} KiB: answers {flood['statuses']}, {flood['runs']} runs stored, {flood['stored']:,} bytes "
          f"= {flood['ratio']:.2f}x the limit (target <= 2x)")
    settings = nonsense_settings()
    print(f"nonsense settings: {settings['refused_by_name']} of {settings['tried']} values over "
          f"{settings['settings']} number settings refused with one line naming the variable")
    export = export_paths()
    print(f"export odd paths: {export['one_line_nothing_left']} of {export['cases']} refused with one line, "
          f"no traceback, nothing left")
    met = (flood["ratio"] <= 2 and settings["refused_by_name"] == settings["tried"]
           and export["one_line_nothing_left"] == export["cases"])
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
