"""Fingerprints of what a set of small recipes trains, analyses and draws, to check that a change of the code's
structure changed no number: run it on the commit before and on the commit after, and compare the two files.

For each case it trains a run with ``landscape train`` (the CLI of the interpreter that runs this script, so
``PYTHONPATH=<checkout>`` picks the code), analyses every checkpoint with every pass (small options), draws the
accuracy and Hessian figures, and prints one line per file: its path and the sha256 of its content, where the
content is the file's bytes (checkpoints, client files, partition, NPZ arrays, PNG) or, for the JSON and JSONL
files, their values with what depends on the clock or the folder removed (``seconds``, ``time``, ``elapsed``,
absolute paths, the code version), and for the PDFs their bytes without the creation date. Usage:

    python tools/fingerprint.py OUT > before.txt     # in the old checkout (or PYTHONPATH=old)
    python tools/fingerprint.py OUT2 > after.txt     # in the new one
    diff before.txt after.txt
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# (name, training flags): digits, the reference partition, each an algorithm family (plain, SAM, global-guided
# SAM with server state, control variates), the CNN (channels-last on the CPU) and the MLP.
CASES = {
    "fedavg-cnn": ["--algorithm", "fedavg", "--model", "cnn"],
    "fedsam-cnn": ["--algorithm", "fedsam", "--model", "cnn"],
    "fednsam-mlp": ["--algorithm", "fednsam", "--model", "mlp"],
    "fedvssam-mlp": ["--algorithm", "fedvssam", "--model", "mlp"],
    "fedsmoo-mlp": ["--algorithm", "fedsmoo", "--model", "mlp"],
    "scaffold-cnn": ["--algorithm", "scaffold", "--model", "cnn"],
}
TRAIN = ["--clients", "6", "--participation", "0.5", "--rounds", "3", "--local-steps", "3", "--batch-size", "16",
         "--checkpoint-every", "1", "--set", "train.keep_clients=true", "--quiet"]
ANALYZE = ["--checkpoints", "all", "--passes", "loss,hessian,sharpness,flatness,incompatibility,alignment,surface",
           "--analysis-samples", "200", "--grid", "5", "--set", "hessian.top_k=2", "--set", "hessian.trace_hvps=6",
           "--set", "hessian.density_runs=1", "--set", "hessian.density_steps=4", "--set", "sharpness.steps=2",
           "--set", "incompatibility.batches=2", "--set", "alignment.batches=2", "--quiet"]
CLOCK_KEYS = {"seconds", "time", "elapsed", "started", "finished", "wall_seconds", "version", "commit", "run",
              "checkpoint", "path", "date"}


def landscape(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "landscape", *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"landscape {' '.join(args)} failed:\n{done.stderr[-2000:]}")


def scrubbed(value):
    """``value`` without the entries that depend on the clock or the folder."""
    if isinstance(value, dict):
        return {k: scrubbed(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


def digest(path: Path) -> str:
    if path.suffix == ".json":
        data = json.dumps(scrubbed(json.loads(path.read_text())), sort_keys=True).encode()
    elif path.suffix == ".jsonl":
        rows = [scrubbed(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        data = json.dumps(rows, sort_keys=True).encode()
    elif path.suffix == ".pdf":  # the creation date aside
        data = re.sub(rb"/CreationDate \(D:[^)]*\)", b"", path.read_bytes())
    else:
        data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    for name, flags in CASES.items():
        run = out / name
        if not (run / "recipe.toml").exists():
            landscape("train", *flags, *TRAIN, "--out", str(run))
            landscape("analyze", str(run), *ANALYZE)
            landscape("figures", "figures/accuracy.toml", "--runs", str(run), "--out", str(run / "figures"))
        for path in sorted(p for p in run.rglob("*") if p.is_file() and p.suffix != ".lock"):
            print(f"{path.relative_to(out)} {digest(path)}")


if __name__ == "__main__":
    main()
