"""Heavy read answers: an Inside report as JSON (every head's attention over every position: hundreds of
KiB on a small model, MiB on a larger one) and a saved trace's file. Each is worked out once, then asked
again and again (a room, a script), holds no stream slot, and serialising it again for every request took
more of the CPU than the replies being decoded.

So each is serialised once and kept as bytes (`Encoded`), beside a gzip copy: a client that accepts gzip
gets that, as it is (nginx passes an answer already compressed through without compressing it again), with
an ETag, so a repeat that sends it back in If-None-Match gets a 304 and no body. And each is counted against
the client address (as the trusted proxy reports it, as every per-address limit counts): at most
GLASSBOX_HEAVY_READ_BYTES_PER_SECOND of them, as sent, with a floor per answer (a 304 costs lookups too);
past it, 429 with Retry-After (webapp/web/counts.py HeavyReads).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request
from werkzeug.exceptions import TooManyRequests

from webapp.web.encoded import Encoded, KeptAnswers
from webapp.web.state import glassbox

__all__ = ["Encoded", "KeptAnswers", "admit", "answer", "bulk_request", "charge_bulk_request", "kept_file", "took"]

SMALLEST_CHARGE = 64 * 1024  # what a heavy answer counts at least, a 304 too: its lookups cost as much
HEAVY_READS_FULL = ("This address has read more large answers (Inside reports, trace files) than "
                    "GLASSBOX_HEAVY_READ_BYTES_PER_SECOND allows ({rate:,} KiB a second); try again in {wait} s.")


def bulk_request() -> None:
    """This request's work is bulk (a heavy answer, a wait for a whole job, a refusal of either): the CPU time
    its thread spends counts against GLASSBOX_BULK_SHARE as the worker's whole jobs do. The interpreter and
    the cores are the replies' too, and a flood of such requests took more of them than its jobs did."""
    g.bulk_request = True


def charge_bulk_request() -> None:
    """After a request (app.after_request): a bulk request's CPU time, charged to the core's bulk share."""
    if g.get("bulk_request") and "cpu_started" in g:
        glassbox().core.charge_bulk(time.thread_time() - g.cpu_started)


def admit() -> None:
    """Before any work for a heavy answer: 429 with Retry-After when this address has spent its share."""
    bulk_request()
    wait = glassbox().heavy_reads.wait(request.remote_addr or "")
    if wait > 0:
        rate = current_app.config["GLASSBOX"].heavy_read_bytes_per_second
        seconds = math.ceil(wait)
        raise TooManyRequests(HEAVY_READS_FULL.format(rate=rate // 1024, wait=seconds), retry_after=seconds)


def took(n: int) -> None:
    """A heavy answer made here of `n` bytes (a page) was sent to this address."""
    glassbox().heavy_reads.take(request.remote_addr or "", max(n, SMALLEST_CHARGE))


def answer(encoded: Encoded, *, mimetype: str = "application/json", headers: dict[str, str] | None = None) -> Response:
    """The kept bytes as the request can take them (gzip or not; 304 when it has them), counted against the
    client address."""
    common = {"ETag": f'"{encoded.etag}"', "Vary": "Accept-Encoding", "Cache-Control": "private, no-cache"}
    if request.if_none_match.contains_weak(encoded.etag):
        took(0)
        return Response(status=304, headers=common)
    compressed = request.accept_encodings.quality("gzip") > 0
    body = encoded.gzipped if compressed else encoded.body
    took(len(body))
    response = Response(body, mimetype=mimetype, headers={**common, **(headers or {})})
    if compressed:
        response.headers["Content-Encoding"] = "gzip"
    return response


def kept_file(key: tuple, filename: str, make: Callable[[], Any]) -> Response:
    """A saved file's JSON (a trace's, a sweep's) as an attachment: made once and kept as bytes under `key`
    (webapp/web/encoded.py KeptAnswers). The kept bytes are anyone's who names the key: check the owner first."""
    encoded = glassbox().kept_answers.get(key, lambda: Encoded.json(make()))
    return answer(encoded, headers={"Content-Disposition": f'attachment; filename="{filename}"'})
