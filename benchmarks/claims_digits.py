"""Benchmark: the shipped claims on digits, each verdict checked against the same claims trained and analysed
with the other memory layout (issue 43's FRAGILE check).

Two ``landscape claims`` calls over ``claims/*.toml``: first with ``train.memory_format = "contiguous"`` in runs of
their own (``runs/figures-contiguous``, results in ``runs/claims-digits-contiguous``), then with the default
layout ("auto": channels-last for the digits CNN on the CPU; runs in ``runs/figures``) and ``--compare-with`` the
first, so that every claim and comparison whose verdict differs between the two is marked FRAGILE in the table
(``runs/claims-digits/claims.md``, what ``benchmarks/publish.py claims-digits`` publishes). Both calls reuse the
runs and results they find, so an interrupted benchmark continues. Usage:

    .venv/bin/python benchmarks/claims_digits.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "claims").glob("*.toml"))
OTHER_LAYOUT = ("--set", "train.memory_format=contiguous", "--figures-out", "runs/figures-contiguous",
                "-o", "runs/claims-digits-contiguous")
DEFAULT_LAYOUT = ("-o", "runs/claims-digits", "--compare-with", "runs/claims-digits-contiguous")


def main() -> None:
    for extra in (OTHER_LAYOUT, DEFAULT_LAYOUT):
        done = subprocess.run([sys.executable, "-m", "landscape", "claims", *CLAIMS, *extra, "--quiet"], cwd=ROOT)
        if done.returncode:
            raise SystemExit(done.returncode)


if __name__ == "__main__":
    main()
