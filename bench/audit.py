"""The hash-chained audit trail: what chaining costs a write, alone and with writers side by side
(appends take their turn on the chain's head), and how fast `audit_verify` walks the chain.

    .venv/bin/python bench/audit.py

Reference figures, held to no target. The bench database keeps its events (the trail is append-only).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.database import django_setup
from bench.report import Figure, record
from bench.stats import percentile, summary

SINGLE = 500
WRITERS, EACH = 8, 100


def main() -> None:
    django_setup()
    from django.db import connection, transaction

    from desktops.audit import SYSTEM, audit_chain_verify, audit_record

    def append(n: int) -> float:
        started = time.perf_counter()
        with transaction.atomic():
            audit_record(actor=SYSTEM, action="bench.append", target=f"dsk_{n}", n=n)
        return time.perf_counter() - started

    alone = [append(n) for n in range(SINGLE)]
    print(summary("append, one writer", [s * 1000 for s in alone], "ms"))

    side_by_side: list[float] = []
    gate = threading.Barrier(WRITERS)

    def writer() -> None:
        try:
            gate.wait()
            side_by_side.extend(append(n) for n in range(EACH))
        finally:
            connection.close()

    threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = WRITERS * EACH / (time.perf_counter() - started)
    print(summary(f"append, {WRITERS} writers", [s * 1000 for s in side_by_side], "ms"))
    print(f"{'appends per second, ' + str(WRITERS) + ' writers':<28} {rate:8.0f}")

    started = time.perf_counter()
    report = audit_chain_verify()
    verified = report.checked / (time.perf_counter() - started)
    assert report.broken is None, report.broken
    print(f"{'verified per second':<28} {verified:8.0f}   ({report.checked} events)")

    record(
        Figure("audit append p95, one writer", round(percentile(alone, 0.95) * 1000, 2), "ms"),
        Figure(f"audit append p95, {WRITERS} writers", round(percentile(side_by_side, 0.95) * 1000, 2), "ms"),
        Figure(f"audit appends per second, {WRITERS} writers", round(rate), "/s", higher_is_better=True),
        Figure("audit events verified per second", round(verified), "/s", higher_is_better=True),
    )


if __name__ == "__main__":
    main()
