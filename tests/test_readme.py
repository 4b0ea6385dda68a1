"""The README's commands and the documentation site's, run as printed: every fenced shell block (```bash,
```sh, ```shell, ```console) line by line with the installed ``landscape`` on PATH, every ```python block
in a subprocess, so a printed command can no longer break unnoticed. The pages: README.md first, then every
page of the ``nav:`` of mkdocs.yml in nav order, except the generated reference (docs/reference/) and the
results (docs/results/). A command printed on several pages (the same text exactly) runs once, where it
first appears. Test ids name the page and line: ``README-line12``, ``guides/train-line30``.

How it runs. One workspace per session: a temporary folder holding copies of the recipe folders (train/,
analyze/, figures/, claims/), the pages' placeholders made real by ``SETUP`` (``runs/demo``: the demo's three
runs; ``runs/x``: a FedSAM run with kept clients and checkpoints at rounds 0, 10 and 20; ``ckpt/``,
``runs/other``, ``mine.pt``, ``states/`` and the ``mylab`` module that the bring-your-own examples name), then
each command in order, so a later command sees what an earlier one wrote (the analyze guide's examples read
the runs the train guide's examples made).

Each command is a process of its own. A ``landscape`` or ``python FILE.py`` command that is one simple command
(bash expands its words) and every Python block start from a warm launcher (tests/support/warm.py): a process with
torch and the package imported once, forked per command, so that ~50 commands do not each spend seconds importing
and tearing down torch. Everything else (pipes, ``&&``, cp) runs in bash as printed.

Small settings. ``LANDSCAPE_README_SMALL`` (default 1) runs the commands that take minutes with small
settings: ``SMALL`` maps such a command's exact text to the command the test runs instead, with a comment
above each entry saying what is shrunk (mostly flags appended or replaced: fewer rounds, one local step, a
100-sample analysis set, small pass options, a 5x5 surface grid). The package never reads the variable: only
this file does. ``runs/demo`` is made by ``landscape demo`` shrunk with ``--set`` as any figure recipe is
(its runs, 30 rounds and checkpoints every 10, but one local step per round and a small analysis: minutes
alone as printed); so the pages' paths and rounds (runs/demo/runs/..., round 30) stay as printed and nothing is
rewritten. LANDSCAPE_README_SMALL=0 runs every
command as printed (``landscape demo`` included): tens of minutes.

Skipped, by exact text with the reason (``SKIP``): what installs (make demo / make test, pip install), serves
until stopped, needs a GPU, torchrun, a network or data that must be downloaded; ``REQUIRES``: a command that
needs an optional extra the test extras do not install runs only where it is installed. Commands that wait on
a fix elsewhere are expected to fail (``XFAIL``, not strict, so they pass once fixed). One entry of these
tables serves a command wherever it is printed, and a test checks that every entry still names a command of
some page, so none goes stale. The slow part is the commands themselves (minutes of CPU in small mode, one
thread each, one after the other); deselect it with ``-k "not runs_as_printed"`` (the checks of the tables,
pages, paths and extraction stay).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml  # PyYAML: mkdocs (in the test extra) depends on it
from support.warm import WarmLauncher

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
NOT_RUN = ("reference/", "results/")  # docs/ folders whose pages are not run: generated, or measured
RECIPE_FOLDERS = ("train", "analyze", "figures", "claims")
SHELL_TAGS = {"bash", "sh", "shell", "console"}
SMALL_MODE = os.environ.get("LANDSCAPE_README_SMALL", "1") != "0"
TIMEOUT_S = 900 if SMALL_MODE else 7200

# the pass options of a quick analysis: top-2 eigenvalues to a 5% residual, few probes, one sharpness radius from
# one start, 2 clients for the client-level metrics (none for the clients' lambda_max: half the pass's products);
# analyze refuses options of passes it does not run, so each command below appends those of its passes, with 100
# samples
PASS_SMALL = {
    "loss": "--set loss.clients=2",
    "hessian": "--set hessian.top_k=2 --set hessian.tol=0.05 --set hessian.trace_hvps=6 --set hessian.density_runs=1"
               " --set hessian.density_steps=4 --set hessian.clients=-1",
    "sharpness": "--set sharpness.rhos=[0.05] --set sharpness.steps=3 --set sharpness.starts=1"
                 " --set sharpness.adaptive=false --set sharpness.clients=2",
    "flatness": "",
    "incompatibility": "--set incompatibility.batches=2 --set incompatibility.clients=2",
    "alignment": "--set alignment.clients=2 --set alignment.batches=2",
}


def analyze_small(passes: str = ",".join(PASS_SMALL), clients: bool = True) -> str:
    """The small settings of an analysis of ``passes`` (a comma list); without clients (a state_dict) their
    ``clients`` options left out."""
    flags = " ".join(PASS_SMALL[name] for name in passes.split(","))
    if not clients:
        flags = re.sub(r" ?--set \w+\.clients=-?\d+", "", flags)
    return f"--analysis-samples 100 {flags} --quiet"


# the same for a figure recipe: its runs one round of one local step, the analysis on 100 samples (the options of
# the passes it runs are added per figure below)
FIGURE_SMALL = "--set train.rounds=1 --set train.local_steps=1 --set analyze.analysis_samples=100 --quiet"
# the demo (figures/demo.toml, its 30 rounds and checkpoints) shrunk as any figure recipe is: one local step per
# round, 100 analysis samples, a 5x5 surface and the quick options of every pass
DEMO_SMALL = ("landscape demo --out runs/demo --set train.local_steps=1 --set analyze.analysis_samples=100"
              " --set surface.grid=5 " + " ".join(PASS_SMALL.values()).replace("  ", " ") + " --quiet")

STATE_DICTS = """
import torch
from landscape.models import build_model
from mylab.nets import make_net
torch.manual_seed(0)
torch.save(make_net().state_dict(), "mine.pt")
for name in ("a", "b"):
    torch.save(build_model("mlp", (1, 8, 8), 10, {}).state_dict(), f"states/{name}.pt")
"""

# The checkpoint files of a federated loop of one's own that the README's `landscape import` reads (before the
# guide's loop, docs/guides/own-fl-code.md, writes its own): the global model of rounds 0-2, four clients' of rounds
# 1-2 and the partition, named as the guide's loop names them.
FL_CHECKPOINTS = """
import json, os, torch
from mylab.nets import make_net
torch.manual_seed(0)
net = make_net()
os.makedirs("ckpts/round-0", exist_ok=True)
torch.save(net.state_dict(), "ckpts/round-0/global.pt")
json.dump({i: list(range(i, 400, 4)) for i in range(4)}, open("ckpts/partition.json", "w"))
for t in (1, 2):
    os.makedirs(f"ckpts/round-{t}", exist_ok=True)
    clients = {i: {k: v + 0.01 * torch.randn_like(v) for k, v in net.state_dict().items()} for i in range(4)}
    for i, state in clients.items():
        torch.save(state, f"ckpts/round-{t}/client-{i}.pt")
    net.load_state_dict({k: torch.stack([s[k] for s in clients.values()]).mean(0) for k in clients[0]})
    torch.save(net.state_dict(), f"ckpts/round-{t}/global.pt")
"""

# The files the README's placeholders need (the mylab module, a script writing mine.pt and states/, one writing
# the checkpoint files of an FL loop of one's own), written into the workspace before SETUP runs.
WORKSPACE_FILES = {
    "mylab/__init__.py": "",
    "mylab/nets.py": ("import torch\n\n\ndef make_net():\n"
                      "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(),\n"
                      "                               torch.nn.Linear(16, 10))\n"),
    "make_state_dicts.py": STATE_DICTS,
    "make_fl_checkpoints.py": FL_CHECKPOINTS,
    "mylab/data.py": ("import torch\n\n\ndef make_test_set():\n"
                      "    g = torch.Generator().manual_seed(0)\n"
                      "    return torch.randn(120, 1, 8, 8, generator=g), torch.randint(0, 10, (120,), generator=g)\n"
                      "\n\ndef make_train_set():\n"
                      "    from sklearn.datasets import load_digits\n"
                      "    d = load_digits()\n"
                      "    x = torch.tensor(d.data[:400] / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)\n"
                      "    return x, torch.tensor(d.target[:400])\n"),
}
SETUP = [
    DEMO_SMALL if SMALL_MODE else "landscape demo --out runs/demo --quiet",
    # small: 20 rounds (checkpoints 0, 10, 20: the README's round-0020.pt, 3 for PCA directions) of one local step
    "landscape train --algorithm fedsam --keep-clients --name x --quiet" + (" --rounds 20 --local-steps 1"
                                                                              if SMALL_MODE else ""),
    "cp -r runs/x/checkpoints ckpt && cp -r runs/x runs/other && mkdir states",
    "python make_state_dicts.py",
    "python make_fl_checkpoints.py",
]

# Commands not run: exact text -> why.
SKIP = {
    "make demo": "installs into .venv (this test runs in it); the demo itself runs below",
    "make test": "installs into .venv and runs the whole suite, this file included",
    "pip install -e '.[tensorboard]'": "installs into .venv (the test extras hold tensorboard already)",
    "tensorboard --logdir runs/": "a web server: it serves until it is stopped",
    "wandb sync runs/my-run/wandb/offline-run-*": "uploads to Weights & Biases: needs a network and an account",
    "landscape figures figures/fednsam-fig1-surfaces.toml --scale paper": "GPU scale, CIFAR-100 on disk",
    "landscape train train/cifar100-fednsam.toml --device cuda": "needs a GPU and CIFAR-100 on disk",
    "landscape train --dataset femnist --data-root leaf/data --partition natural --clients 100 --model cnn":
        "needs LEAF's FEMNIST on disk (downloaded and converted by LEAF's preprocess.sh); tests/data/test_leaf.py "
        "trains on tiny files in its format",
    "landscape train --dataset shakespeare --data-root leaf/data --partition natural --clients 100 --model "
    "stacked-lstm": "needs LEAF's Shakespeare on disk (downloaded and converted by LEAF's preprocess.sh); "
                    "tests/data/test_leaf.py trains on tiny files in its format",
    **{cmd: "torchrun (several processes, a GPU or several machines)" for cmd in (
        "torchrun --standalone --nproc-per-node 4 -m landscape train train/cifar100-fednsam.toml --device cuda",
        "torchrun --standalone --nproc-per-node 4 -m landscape analyze runs/x --checkpoints all --device cuda",
        "torchrun --standalone --nproc-per-node 4 -m landscape analyze runs/x --directions random --grid 51",
        "torchrun --standalone --nproc-per-node 2 -m landscape train --algorithm scaffold --device cpu",
        "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-id fednsam --rdzv-backend c10d --rdzv-endpoint host0:29500"
        " -m landscape train train/cifar100-fednsam.toml --device cuda")},
    # the extend guide's use.py block imports the guide's own modules as a package (mylab_ext/):
    # tests/test_extend_guide.py writes them into one and runs the block there
    'run = Path("runs/fedavgm")': "needs the guide's mylab_ext package: tests/test_extend_guide.py runs it",
}

# Commands that need an optional extra the test extras do not install: exact text -> the module; run (with their
# SMALL settings) where it is installed, skipped elsewhere.
REQUIRES = {
    "landscape train train/digits-fedavg.toml --log tensorboard,wandb --name tracked": "wandb",
}

# Commands that fail until a fix elsewhere lands: exact text (a Python block: its first line that is not an
# import) -> the fix they wait on.
XFAIL: dict[str, str] = {}

# Small settings (LANDSCAPE_README_SMALL=1): exact text -> the command run instead.
SMALL = {
    # 2 rounds of one local step instead of 30 of 5 epochs
    "landscape train --algorithm fedavg --dataset digits --partition dirichlet-client-reuse --alpha 0.1"
    " --clients 20"
    " --participation 0.25 --rounds 30":
        "landscape train --algorithm fedavg --dataset digits --partition dirichlet-client-reuse --alpha 0.1"
        " --clients 20"
        " --participation 0.25 --rounds 2 --local-steps 1",
    # 2 rounds of one local step instead of the recipe's 30 rounds of 5 epochs
    "landscape train train/digits-fedavg.toml --set train.weight_decay=1e-3 --name wd":
        "landscape train train/digits-fedavg.toml --set train.weight_decay=1e-3 --name wd --rounds 2"
        " --local-steps 1",
    # resumed to 3 rounds instead of 60
    "landscape train --resume runs/wd --rounds 60": "landscape train --resume runs/wd --rounds 3",
    # 1 round of one local step per run instead of 30 rounds of 5 epochs (the 8 runs of the sweep)
    "landscape train --algorithm fedsam,fednsam --alpha 0.6,0.1 --seed 0,1 --rounds 30 --out runs/sweep":
        "landscape train --algorithm fedsam,fednsam --alpha 0.6,0.1 --seed 0,1 --rounds 1 --local-steps 1"
        " --out runs/sweep --quiet",
    # every algorithm of the recipe for 1 round of one local step instead of 30 rounds of 5 epochs
    "landscape train train/digits-quick.toml --out runs/digits-quick":
        "landscape train train/digits-quick.toml --out runs/digits-quick --rounds 1 --local-steps 1 --quiet",
    "landscape train train/mnist1d-quick.toml --out runs/mnist1d-quick":
        "landscape train train/mnist1d-quick.toml --out runs/mnist1d-quick --rounds 1 --local-steps 1 --quiet",
    # the tracking examples: 2 rounds of one local step instead of the recipe's 30 of 5 epochs, or of 50
    "landscape train train/digits-fedavg.toml --log tensorboard,wandb --name tracked":
        "landscape train train/digits-fedavg.toml --log tensorboard,wandb --name tracked --rounds 2 --local-steps 1"
        " --quiet",
    "landscape train --log tensorboard --set train.rounds=50 --name tb":
        "landscape train --log tensorboard --set train.rounds=2 --set train.local_steps=1 --name tb --quiet",
    # the analyze examples: the quick analysis (analyze_small) instead of every pass at its defaults
    "landscape analyze runs/digits-quick/digits-fedsam-dirr0.1-cnn-c20-s0":
        "landscape analyze runs/digits-quick/digits-fedsam-dirr0.1-cnn-c20-s0 " + analyze_small(),
    "landscape analyze runs/digits-quick --checkpoints all --passes hessian,flatness":
        "landscape analyze runs/digits-quick --checkpoints all --passes hessian,flatness "
        + analyze_small("hessian,flatness"),
    # 100 test samples instead of 1000 (the test set has 360)
    "landscape analyze runs/x/checkpoints/round-0020.pt --split test --analysis-samples 1000":
        "landscape analyze runs/x/checkpoints/round-0020.pt --split test " + analyze_small(),
    "landscape analyze ckpt/ --backend pyhessian": "landscape analyze ckpt/ --backend pyhessian " + analyze_small(),
    "landscape analyze runs/x analyze/quick.toml": "landscape analyze runs/x analyze/quick.toml " + analyze_small(),
    "landscape analyze mine.pt --model mylab.nets:make_net --dataset mylab.data:make_test_set":
        "landscape analyze mine.pt --model mylab.nets:make_net --dataset mylab.data:make_test_set "
        + analyze_small("loss,hessian,sharpness", clients=False),
    "landscape analyze states/ --model mlp --dataset digits --split test --passes loss,hessian":
        "landscape analyze states/ --model mlp --dataset digits --split test --passes loss,hessian "
        + analyze_small("loss,hessian", clients=False),
    # the demo's runs with one local step and a quick analysis (DEMO_SMALL), as SETUP made them
    "landscape demo --out runs/demo": DEMO_SMALL,
    # the figure's runs 1 round of one local step, 100 samples (FIGURE_SMALL), a 5x5 surface
    "landscape figures figures/fednsam-fig1-surfaces.toml":
        "landscape figures figures/fednsam-fig1-surfaces.toml --set surface.grid=5 " + FIGURE_SMALL,
    # 2 seeds instead of 3, each run as in FIGURE_SMALL, the quick hessian pass
    "landscape figures figures/fedsam-hessian.toml --seeds 0,1,2":
        f"landscape figures figures/fedsam-hessian.toml --seeds 0,1 {PASS_SMALL['hessian']} {FIGURE_SMALL}",
    # the claims' plan (--dry-run: every claim file, figure and run is read and listed) instead of 160 runs
    # trained and analysed (45 minutes); tests/claims/test_claims.py runs the command itself on tiny runs
    "landscape claims claims/*.toml": "landscape claims claims/*.toml --dry-run",
    "landscape claims claims/*.toml --set dataset.name=mnist1d --figures-out runs/figures-mnist1d"
    " -o runs/claims-mnist1d":
        "landscape claims claims/*.toml --set dataset.name=mnist1d --figures-out runs/figures-mnist1d"
        " -o runs/claims-mnist1d --dry-run",
    # the loss surfaces: a 5x5 grid on 100 samples instead of 41x41 or 51x51 on the whole training set (set as
    # an option where the command sets the surface by options alone: --grid would choose the pass for it)
    **{cmd: f"{re.sub(r' --grid [0-9]+', '', cmd)} --grid 5 --analysis-samples 100 --quiet" for cmd in (
        "landscape analyze runs/x --directions random --grid 51 --span -1:1",
        "landscape analyze runs/x --directions pca --checkpoints all",
        "landscape analyze runs/x --directions clients",
        "landscape analyze runs/x --directions interpolate --grid 41",
        "landscape analyze runs/x --directions random --data client:3")},
    "landscape analyze runs/x --set surface.normalization=filter-reference --set surface.reference=round:0":
        "landscape analyze runs/x --set surface.normalization=filter-reference --set surface.reference=round:0"
        " --set surface.grid=5 --analysis-samples 100 --quiet",
}

# What a Python block needs that its page leaves to the reader (its first line that is not an import -> code
# run before it): the bring-your-own block's model, a loader of 64 samples, client models and a regressor on float
# targets.
PRELUDE = {
    "eigs = landscape.hessian_eigs(model, loader, k=5)": """
import torch
import landscape
from torch.utils.data import DataLoader, TensorDataset
runs = "runs/demo/runs/{}"
model = global_model = landscape.open_run(runs.format("fedavg")).model()
client_a, client_b = (landscape.open_run(runs.format(name)).model() for name in ("fedsam", "fednsam"))
train, _ = landscape.open_run(runs.format("fedavg")).data()
loader = DataLoader(TensorDataset(train.x[:64], train.y[:64]), batch_size=32)
regressor = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 1))
x, y_float = train.x[:64], torch.randn(64, 1, generator=torch.Generator().manual_seed(0))
""",
}


@dataclass(frozen=True)
class Command:
    kind: str   # "shell" or "python"
    text: str   # a shell command (continuations joined, comment dropped) or a Python block
    line: int   # where it starts on its page
    page: str = "README"  # "README", or a docs page without its ".md" ("guides/train")

    @property
    def key(self) -> str:
        """What the tables above name it by: the command, or a Python block's first line that is not an import
        (its trailing comment dropped)."""
        if self.kind == "shell":
            return self.text
        lines = [re.split(r"\s+#\s", s, maxsplit=1)[0].strip() for s in self.text.splitlines()]
        return next(s for s in lines if s and not s.startswith(("import ", "from ", "#")))

    @property
    def where(self) -> str:
        return f"{self.page}-line{self.line}"


def shell_commands(block: list[str], first_line: int, page: str = "README") -> list[Command]:
    """A shell block's commands: continuation lines joined, comment lines and trailing comments dropped,
    whitespace runs as one space."""
    commands, pending, start = [], "", first_line
    for number, raw in enumerate(block, first_line):
        line = re.split(r"(?:^|\s)#(?:\s|$)", raw, maxsplit=1)[0].rstrip()
        if not pending:
            start = number
        pending += " " + line.removesuffix("\\")
        if line.endswith("\\"):
            continue
        if pending.strip():
            commands.append(Command("shell", " ".join(pending.split()), start, page))
        pending = ""
    return commands


def readme_commands(text: str, page: str = "README") -> list[Command]:
    """Every shell command and Python block of a page (the README or a docs page), in order."""
    commands, block, tag, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```\s*([\w+-]*)", line)
        if block is None and fence:
            block, tag, start = [], fence.group(1).lower(), number + 1
        elif block is not None and line.startswith("```"):
            if tag in SHELL_TAGS:
                commands += shell_commands(block, start, page)
            elif tag == "python":
                commands.append(Command("python", "\n".join(block), start, page))
            block = None
        elif block is not None:
            block.append(line)
    return commands


def nav_pages(nav) -> list[str]:
    """The pages of a mkdocs ``nav:`` (nested lists of ``title: page`` maps), in nav order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav or [] for page in nav_pages(item)]


def pages() -> dict[str, Path]:
    """The pages whose commands run, in order: the README, then the site's pages in nav order (not the
    generated reference, not the results), by name (``README``, ``guides/train``)."""
    config = yaml.safe_load(MKDOCS.read_text(encoding="utf-8"))
    docs = ROOT / config.get("docs_dir", "docs")
    found = {"README": README}
    for page in nav_pages(config["nav"]):
        if not page.startswith(NOT_RUN) and "://" not in page:
            found.setdefault(page.removesuffix(".md"), docs / page)
    return found


PAGES = pages()
ALL_COMMANDS = [command for name, path in PAGES.items()
                for command in readme_commands(path.read_text(encoding="utf-8"), name)]


def first_of_each(commands: list[Command]) -> list[Command]:
    """Each command once (kind and exact text), where it first appears: the README's first, then the pages'
    in order."""
    seen, kept = set(), []
    for command in commands:
        if (command.kind, command.text) not in seen:
            seen.add((command.kind, command.text))
            kept.append(command)
    return kept


COMMANDS = first_of_each(ALL_COMMANDS)


def environment(workspace: Path) -> dict:
    """The commands' environment: the installed ``landscape`` (and this Python) first on PATH, one torch thread,
    no display."""
    scripts = {sysconfig.get_path("scripts"), str(Path(sys.executable).parent)}
    env = dict(os.environ, PATH=os.pathsep.join([*scripts, os.environ.get("PATH", "")]), MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", HOME=str(workspace / "home"))
    env.pop("LANDSCAPE_README_SMALL", None)  # the package never sees it
    return env


# what makes a command more than one simple command for bash: several commands, redirections, substitutions
CONTROL = set("|&;<>()`\n")


def simple_command(command: str, workspace: Path) -> tuple[list[str], dict] | None:
    """A command that is one simple command, as the words bash passes it (bash itself expands the quotes, globs,
    braces and variables, by printing them) and the PYTHONPATH it assigns before them, if any; None when it is
    more than that (bash runs it)."""
    if CONTROL & set(command):
        return None
    printed = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], cwd=workspace,
                             env=environment(workspace), capture_output=True, text=True, check=True).stdout
    words, assigned = printed.split("\0")[:-1], {}
    while words and words[0].startswith("PYTHONPATH="):
        assigned["PYTHONPATH"] = words.pop(0).removeprefix("PYTHONPATH=")
    return (words, assigned) if words else None


@dataclass
class Workspace:
    """The commands' folder and the warm launcher that runs its ``landscape`` commands and Python blocks
    (tests/support/warm.py: one process with the heavy modules imported, a forked child per command)."""
    folder: Path
    launcher: WarmLauncher

    def shell(self, command: str) -> subprocess.CompletedProcess:
        words, assigned = simple_command(command, self.folder) or ([""], {})
        if words[0] == "landscape":
            return self.launcher.console_script(words, assigned)
        if words[0] == "python" and len(words) > 1 and words[1].endswith(".py") and not assigned:
            return self.launcher.script(words[1], words[2:])
        return subprocess.run(["bash", "-c", command], cwd=self.folder, env=environment(self.folder),
                              capture_output=True, text=True, timeout=TIMEOUT_S)

    def python(self, code: str) -> subprocess.CompletedProcess:
        return self.launcher.python(code)


def check(result: subprocess.CompletedProcess, what: str) -> None:
    output = (result.stdout + result.stderr)[-4000:]
    assert result.returncode == 0, f"{what}\nexit {result.returncode}:\n{output}"
    assert "Traceback" not in output, f"{what}\nprinted a traceback:\n{output}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The recipe folders copied, the pages' placeholders made real (``SETUP``)."""
    folder = tmp_path_factory.mktemp("readme")
    for name in RECIPE_FOLDERS:
        shutil.copytree(ROOT / name, folder / name)
    for name, body in WORKSPACE_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(body, encoding="utf-8")
    (folder / "home").mkdir()
    space = Workspace(folder, WarmLauncher(folder, environment(folder), TIMEOUT_S))
    try:
        for command in SETUP:
            check(space.shell(command), f"setup: {command}")
        yield space
    finally:
        space.launcher.close()


def command_params():
    for command in COMMANDS:
        marks = []
        if command.key in XFAIL:
            marks.append(pytest.mark.xfail(reason=XFAIL[command.key], strict=False))
        yield pytest.param(command, marks=marks, id=command.where)


@pytest.mark.slow  # every printed command, minutes in all
@pytest.mark.parametrize("command", list(command_params()))
def test_readme_runs_as_printed(command: Command, request):
    if command.key in SKIP:
        pytest.skip(SKIP[command.key])
    if command.key in REQUIRES and importlib.util.find_spec(REQUIRES[command.key]) is None:
        pytest.skip(f"needs {REQUIRES[command.key]}, an optional extra the test extras do not install")
    workspace = request.getfixturevalue("workspace")
    if command.kind == "python":
        code = PRELUDE.get(command.key, "") + "\n" + command.text
        check(workspace.python(code), f"{command.where}: python block")
        return
    text = SMALL.get(command.text, command.text) if SMALL_MODE else command.text
    check(workspace.shell(text), f"{command.where}: {text}")


def test_the_pages_are_the_readme_then_the_nav_without_reference_and_results():
    names = list(PAGES)
    assert names[0] == "README" and "index" in names and "guides/train" in names, names
    assert not [name for name in names if name.startswith(NOT_RUN)], names
    missing = [str(path) for path in PAGES.values() if not path.is_file()]
    assert not missing, f"in the nav of mkdocs.yml but not on disk: {missing}"


def test_readme_has_commands_to_run():
    kinds = {c.kind for c in COMMANDS}
    assert kinds == {"shell", "python"}, kinds
    assert sum(c.key not in SKIP for c in COMMANDS) >= 20, [c.key for c in COMMANDS]
    readme = [c for c in COMMANDS if c.page == "README"]
    assert {c.kind for c in readme} == {"shell", "python"}, readme


def test_every_table_entry_names_a_command_of_some_page():
    keys = {c.key for c in ALL_COMMANDS}
    for table in (SKIP, REQUIRES, XFAIL, SMALL, PRELUDE):
        stale = sorted(set(table) - keys)
        assert not stale, f"on no page (README.md, mkdocs.yml's nav): update tests/test_readme.py: {stale}"


def test_no_page_cites_line_numbers():
    for name, path in PAGES.items():
        text = path.read_text(encoding="utf-8")
        cited = re.findall(r"[\w/.-]+\.(?:py|toml|md):\d+|\blines? \d+(?:-\d+)? of\b", text)
        assert not cited, (name, cited)


def expand_braces(path: str) -> list[str]:
    """``train/cifar{10,100}-x.toml`` -> both names (the first brace group first, then the rest)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [name for part in match.group(1).split(",")
            for name in expand_braces(path[:match.start()] + part + path[match.end():])]


def test_every_repository_path_a_page_names_exists():
    """Files and folders of the repository named on a page (a test moved into tests/<package>/, a pass into
    landscape/analyze/passes/ leaves a dangling name), from the repository root or, as docs/architecture.md
    names modules, from the package folder; brace lists are expanded; placeholders such as ``figures/X.toml``
    are left out."""
    top = "|".join(re.escape(name) for name in (".ci", "landscape", "tests", "benchmarks", "docs", "tools",
                                                 *RECIPE_FOLDERS))
    pattern = rf"(?<![\w/.])(?:{top})/(?:[\w./-]|\{{[\w.,-]+\}})*(?:\w|\}})"
    missing = []
    for name, page in PAGES.items():
        text = page.read_text(encoding="utf-8")
        named = {path for found in re.findall(pattern, text) for path in expand_braces(found)}
        missing += [f"{name}: {p}" for p in sorted(named) if not re.search(r"(^|/)X\.", p)
                    and not (ROOT / p).exists() and not (ROOT / "landscape" / p).exists()]
    assert not missing, missing


def test_the_extraction_joins_continuations_and_drops_comments():
    text = "x\n```bash\n# a comment\nlandscape a \\\n    --b 1   # why\n\nlandscape c#d\n```\n```\nnot run\n```\n"
    assert [c.text for c in readme_commands(text)] == ["landscape a --b 1", "landscape c#d"]
    assert readme_commands("```python\nimport x\ny = 1\n```\n") == [Command("python", "import x\ny = 1", 2)]
    assert readme_commands("```bash\nls\n```\n", "guides/x")[0].where == "guides/x-line2"


def test_a_command_printed_on_several_pages_runs_once_where_it_first_appears():
    commands = [Command("shell", "landscape list", 3), Command("shell", "landscape list", 9, "guides/train"),
                Command("python", "landscape list", 12, "guides/train"), Command("shell", "ls", 5, "index")]
    assert first_of_each(commands) == [commands[0], commands[2], commands[3]]
    texts = [(c.kind, c.text) for c in COMMANDS]
    assert len(texts) == len(set(texts))
