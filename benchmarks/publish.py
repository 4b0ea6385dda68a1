"""Regenerate the results tables: run a benchmark (or a landscape command) and write what it measured to
``docs/results/tables/<name>.md``, with where and when it was measured.

Every results table of the README and the docs is one such file (the docs include them with
``--8<-- "docs/results/tables/<name>.md"``; the README, and a docs page for a table that may not exist yet,
between ``<!-- generated: ... -->`` markers), so a number in them is never typed: a rerun of this script writes
it again. Each file starts with a line naming the command that measured it, the commit (and whether the working
tree differed from it), the date, the machine (CPU, cores, memory; the GPU for a table that needs one), the
torch version and thread count, the load average before and after, and how long it took. The benchmark's
standard output is the table (Markdown); its standard error passes through. A benchmark that fails writes
nothing: the previous file stays.

A table that needs a GPU (``gpu-check``) is measured only where torch sees a CUDA device: the run of every
table skips it elsewhere, and naming it there is an error. On a copy of the checkout without git metadata (a
lent GPU machine that received the working tree), ``--commit`` names the commit the copy was made from; the
header says it was given, not read. Usage:

    .venv/bin/python benchmarks/publish.py                 # every table, one after the other
    .venv/bin/python benchmarks/publish.py hessian-cnn demo
    .venv/bin/python benchmarks/publish.py --list
    python3 benchmarks/publish.py gpu-check --commit 1a2b3c4   # on a GPU machine, in a copy of the tree
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "docs" / "results" / "tables"
README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results" / "index.md"
PY = "{python}"  # the running interpreter, filled in at run time


@dataclass(frozen=True)
class Table:
    """One results file: the command that measures it (``{python}`` = this interpreter), where its Markdown comes
    from (the command's standard output, or a file it writes), and images it draws that the docs show."""

    command: tuple[str, ...]
    what: str
    output: str = ""  # a file the command writes (relative to the repository root); "" = its standard output
    images: dict[str, str] = field(default_factory=dict)  # file it writes -> where the docs keep a copy
    fenced: bool = False  # the output is shown as printed (a text block), not read as Markdown
    fresh: str = ""  # a folder under runs/ removed first, so the command starts from nothing (and is timed so)
    elsewhere: bool = False  # run in a new temporary folder (from nothing; its printed paths as a user's are)
    needs_cuda: bool = False  # measured only where torch sees a CUDA device; its file may not exist yet

    def argv(self, root: Path = ROOT) -> list[str]:
        """The command to run: ``{python}`` this interpreter, a part with ``*`` the sorted files it matches."""
        out: list[str] = []
        for part in self.command:
            if part == PY:
                out.append(sys.executable)
            elif "*" in part:
                out += sorted(str(p.relative_to(root)) for p in root.glob(part))
            else:
                out.append(part)
        return out


REGISTRY: dict[str, Table] = {
    "demo": Table((PY, "-m", "landscape", "demo", "--out", "runs/demo"),
                  "what `landscape demo` (= `make demo` after the install) prints, its wall time and memory",
                  images={"runs/demo/surfaces.png": "docs/images/demo-surfaces.png"}, fenced=True,
                  elsewhere=True),
    "train-digits": Table((PY, "benchmarks/train_digits.py"), "FedAvg on digits over 5 seeds",
                          fresh="runs/publish-train-digits"),
    "algorithms-digits": Table((PY, "benchmarks/algorithms_digits.py"),
                               "every algorithm of train/digits-quick.toml on digits", fresh="runs/publish-algorithms"),
    "analyze-digits": Table((PY, "benchmarks/analyze_digits.py"),
                            "`landscape analyze` of a digits FedSAM run, every pass", fresh="runs/publish-analyze"),
    "hessian-cnn": Table((PY, "benchmarks/hessian_vs_pyhessian.py", "--model", "cnn"),
                         "top-5 eigenvalues and one product: ours and the peers on the digits CNN"),
    "hessian-mlp": Table((PY, "benchmarks/hessian_vs_pyhessian.py", "--model", "mlp", "--hidden", "64"),
                         "the same on a digits MLP against its dense Hessian"),
    "gradient-overhead": Table((PY, "benchmarks/gradient_overhead.py"),
                               "our gradient and Hessian-vector product against a plain nn.Module gradient"),
    "train-overhead": Table((PY, "benchmarks/train_overhead.py"),
                            "one client's local steps: landscape's training path against a plain channels-last "
                            "loop, now and at b02ec39"),
    "memory-format": Table((PY, "benchmarks/memory_format.py"),
                           "contiguous against channels-last layout: training step, loss, gradient, product"),
    "lanczos-overhead": Table((PY, "benchmarks/lanczos_overhead.py"),
                              "Lanczos time outside the products on a 657,910-parameter MLP"),
    "trace-estimators": Table((PY, "benchmarks/trace_estimators.py"),
                              "Hessian trace estimators at equal budgets against the exact trace"),
    "stderr-calibration": Table((PY, "benchmarks/stderr_calibration.py"),
                                "calibration of the trace estimators' standard errors over seeds on exact matrices"),
    "sharpness-ascent": Table((PY, "benchmarks/sharpness_ascent.py"),
                              "S_rho: the former 5-step single start against the multi-start converged default",
                              fresh="runs/publish-sharpness"),
    "surface-vs-loop": Table((PY, "benchmarks/surface_vs_loop.py", "--passes"),
                             "a 51x51 surface: ours against loss-landscapes"),
    "clients-scaling": Table((PY, "benchmarks/clients_scaling.py"),
                             "every analysis pass at 20 and at 100 clients", fresh="runs/publish-clients"),
    "resnet-products": Table((PY, "benchmarks/resnet_products.py"),
                             "a Hessian-vector product by each backend against a gradient on ResNet-18-GN"),
    "surface-ranks": Table((PY, "benchmarks/surface_ranks.py", "--configs", "1x1,2x1,1x2"),
                           "the 51x51 digits surface by 1 and 2 torchrun ranks"),
    "threads": Table((PY, "benchmarks/threads.py"), "one torch thread against two, training and a hessian pass",
                     fresh="runs/publish-threads"),
    "gpu-check": Table((PY, "benchmarks/gpu_check.py"),
                       "FedSAM rounds/s, HVP/gradient, lambda_1..5 and a surface for ResNet-18-GN on a GPU",
                       needs_cuda=True),
    "claims-digits": Table((PY, "benchmarks/claims_digits.py"),
                           "the shipped claims on digits, 12 seeds (each file's), FRAGILE where a verdict differs "
                           "with the contiguous layout", output="runs/claims-digits/claims.md"),
    "claims-mnist1d": Table((PY, "-m", "landscape", "claims", "claims/*.toml", "--seeds", "0,1,2,3,4,5,6,7",
                             "--set", "dataset.name=mnist1d", "--figures-out", "runs/figures-mnist1d",
                             "-o", "runs/claims-mnist1d", "--quiet"),
                            "the same claims on MNIST-1D, 8 seeds", output="runs/claims-mnist1d/claims.md"),
}


def _git(*args: str, root: Path) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


RECIPE_FOLDERS = ("train", "analyze", "figures", "claims")  # recipes a benchmark runs: part of what it measured


@contextlib.contextmanager
def worktree(commit: str, root: Path = ROOT) -> Iterator[Path]:
    """The package as it was at ``commit``, for a benchmark's baseline column: a detached git worktree (a working
    directory for its processes: `python -m` imports the package of its cwd first), removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=root, check=True,
                       capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, check=True,
                           capture_output=True)


def commit_line(root: Path, scripts: list[str], given: str = "") -> str:
    """The commit measured, and whether the code it ran differed from it: the package, pyproject.toml, this
    tool, the benchmark ``scripts`` and the shipped recipes they read (``RECIPE_FOLDERS``; docs, tests and
    other benchmarks do not count). ``given``: the commit a
    copy without git metadata was made from (``--commit``); in a checkout it must be the checkout's."""
    commit = _git("rev-parse", "--short", "HEAD", root=root)
    if not commit:
        return f"{given} (given: the tree measured has no git metadata)" if given else "unknown"
    if given and not (commit.startswith(given) or given.startswith(commit)):
        raise SystemExit(f"error: --commit {given} is not this checkout's commit {commit}; nothing written")
    changed = _git("status", "--porcelain", "--", "landscape", "pyproject.toml", "benchmarks/publish.py", *scripts,
                   *RECIPE_FOLDERS, root=root)
    return f"{commit} with uncommitted changes" if changed else commit


def gpu_line() -> str:
    """The first CUDA device torch sees, with its memory ("" where it sees none)."""
    import torch

    if not torch.cuda.is_available():
        return ""
    props = torch.cuda.get_device_properties(0)
    return f"; GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} visible"


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = names[0].strip() if names else cpu
    except OSError:
        pass
    memory = ""
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{memory}"


def torch_line(env: dict) -> str:
    import torch

    from landscape.core.memory_format import AUTO_RULE

    return (f"torch {torch.__version__}, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, memory layout "
            f"\"auto\" unless the command sets it ({AUTO_RULE})")


def as_markdown(text: str) -> str:
    """The benchmark's lines as Markdown: a blank line around every table, trailing blanks dropped."""
    out: list[str] = []
    for line in text.rstrip().splitlines():
        is_row = line.startswith("|")
        if out and out[-1] and out[-1].startswith("|") != is_row:
            out.append("")
        out.append(line.rstrip())
    return "\n".join(out) + "\n"


def elapsed(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


def header(name: str, table: Table, *, commit: str, started: datetime.datetime, seconds: float, loads: tuple,
           env: dict, peak_mib: float) -> str:
    shown = " ".join("python" if p == PY else shlex.quote(p) for p in table.command)
    return (f"<!-- generated by `python benchmarks/publish.py {name}` ({shown}); do not edit: rerun it -->\n\n"
            f"*Measured by `python benchmarks/publish.py {name}` at commit {commit} on "
            f"{started:%Y-%m-%d %H:%M} UTC; {machine_line()}{gpu_line() if table.needs_cuda else ''}; "
            f"{torch_line(env)}; load average {loads[0]:.1f} "
            f"before, {loads[1]:.1f} after; took {elapsed(seconds)}, peak memory of one process "
            f"{peak_mib:,.0f} MiB.*\n\n")


def _peak_child_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux


def publish(name: str, table: Table, *, root: Path = ROOT, tables: Path = TABLES, commit: str = "") -> Path:
    """Run ``table``'s command from ``root`` and write ``tables/<name>.md``; a failed command writes nothing.
    ``commit``: as ``commit_line``'s ``given``."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    if table.fresh:
        if not table.fresh.startswith("runs/publish-"):
            raise ValueError(f"{name}: only a runs/publish-* folder is removed, not {table.fresh}")
        shutil.rmtree(root / table.fresh, ignore_errors=True)
    scripts = [part for part in table.command if part.endswith(".py")]
    commit, loads0 = commit_line(root, scripts, commit), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"publish-{name}-") as folder:
        cwd = Path(folder) if table.elsewhere else root
        started, clock = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
        result = subprocess.run(table.argv(root), cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - clock
        if result.returncode != 0:
            raise SystemExit(f"error: {name}: {shlex.join(table.argv(root))} exited {result.returncode}; "
                             "nothing written")
        body = (cwd / table.output).read_text(encoding="utf-8") if table.output else result.stdout
        for source, copy in table.images.items():
            (root / copy).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cwd / source, root / copy)
    body = re.sub(r"^<!--.*?-->\n+", "", body)  # a command's own generated-by line: this header replaces it
    body = f"```text\n{body.rstrip()}\n```\n" if table.fenced else as_markdown(body)
    tables.mkdir(parents=True, exist_ok=True)
    target = tables / f"{name}.md"
    text = header(name, table, commit=commit, started=started, seconds=seconds,
                  loads=(loads0, os.getloadavg()[0]), env=env, peak_mib=_peak_child_mib()) + body
    temporary = target.with_suffix(".md.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(target)
    return target


MARKER = re.compile(r"(<!-- generated: (docs/results/tables/[\w.-]+\.md)[^>]*-->\n)(.*?)(<!-- end generated -->)",
                    re.S)


def fill_generated(text: str, root: Path = ROOT) -> str:
    """``text`` with every block between ``<!-- generated: FILE ... -->`` and ``<!-- end generated -->``
    replaced by FILE's content (the README's copies of the tables, the results page's GPU table); a block whose
    FILE is not there yet stays as written (the results page says there why no table is shown)."""
    def body(match: re.Match) -> str:
        source = root / match.group(2)
        if not source.is_file():
            return match.group(0)
        return match.group(1) + source.read_text(encoding="utf-8") + match.group(4)

    return MARKER.sub(body, text)


GENERATED_PAGES = (README, RESULTS_PAGE)  # pages with <!-- generated: --> blocks


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def selected(names: list[str], cuda: bool) -> tuple[list[str], list[str]]:
    """(tables to run, tables skipped): every table when ``names`` is empty, but those that need a CUDA device
    only where ``cuda``; named tables as named."""
    if names:
        return list(names), []
    skipped = [] if cuda else [name for name, table in REGISTRY.items() if table.needs_cuda]
    return [name for name in REGISTRY if name not in skipped], skipped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="tables to regenerate (default: every one)")
    parser.add_argument("--list", action="store_true", help="list the tables and what measures them")
    parser.add_argument("--commit", default="", help="the commit a copy without git metadata was made from")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(REGISTRY))
    if unknown:
        raise SystemExit(f"error: no table {', '.join(unknown)}; the tables: {', '.join(REGISTRY)}")
    if args.list:
        for name, table in REGISTRY.items():
            print(f"{name}: {table.what}{' (needs a CUDA device)' if table.needs_cuda else ''}")
        return
    names, skipped = selected(args.names, bool(args.names) or cuda_present())
    for name in skipped:
        print(f"{name}: skipped: torch sees no CUDA device here", file=sys.stderr)
    if len(names) > 1:  # one process per table, so each peak memory is its own; a failure stops no other
        extra = ["--commit", args.commit] if args.commit else []
        failed = [name for name in names
                  if subprocess.run([sys.executable, __file__, name, *extra]).returncode != 0]
        if failed:
            raise SystemExit(f"error: not regenerated: {', '.join(failed)}")
        return
    table = REGISTRY[names[0]]
    if table.needs_cuda and not cuda_present():
        raise SystemExit(f"error: {names[0]} needs a CUDA device and torch sees none here; nothing written")
    print(f"{names[0]}: {table.what} ...", file=sys.stderr, flush=True)
    print(f"wrote {publish(names[0], table, commit=args.commit).relative_to(ROOT)}", file=sys.stderr)
    for page in GENERATED_PAGES:
        page.write_text(fill_generated(page.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
