import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.helpers import invoke, one_line_error

import landscape
from landscape import __version__
from landscape.cli import cli
from landscape.cli.train import _RECIPE_FLAGS
from landscape.figures.recipe.figure import load_figure_recipe
from landscape.workflows.demo import DEMO_FIGURE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FAST = ["--clients", "4", "--participation", "0.5", "--rounds", "2", "--local-steps", "2", "--device", "cpu"]


def test_help_lists_only_built_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    commands = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()}
    assert commands == {"analyze", "claims", "compare", "demo", "figures", "import", "list", "report", "train"}
    examples = {line.split()[1] for line in result.output.split("Options:")[0].splitlines()
                if line.strip().startswith("landscape ")}
    assert examples == commands  # every command has its line in the overview


def test_version():
    assert invoke("--version").output.strip() == f"landscape, version {__version__}"


def test_list_comes_from_the_registries():
    from landscape.data.datasets import DATASETS
    from landscape.data.partitions import PARTITIONS
    from landscape.models import MODELS
    from landscape.train.algorithms import ALGORITHMS

    out = invoke("list").output
    for registry in (DATASETS, PARTITIONS, MODELS, ALGORITHMS):
        for name in registry.names():
            assert f"  {name} " in out
    assert "alpha = 0.1" in out and 'norm = "gn"' in out and "balanced = false" in out
    assert "hidden = [200, 200]" in out and "rhos = [0.01, 0.05, 0.1]" in out  # tuples too are TOML arrays


def test_list_keeps_its_columns_and_lists_what_it_is_asked_for():
    lines = invoke("list").output.splitlines()
    assert max(map(len, lines)) <= 100  # the terminal's width (100 where there is none), names of any length
    only = invoke("list", "algorithms", "hessian").output
    assert only.startswith("algorithms (") and "analysis passes" in only and "datasets" not in only
    assert "\n  hessian " in only and "\n  loss " not in only and "\n  fedsam " in only
    assert invoke("list", "dataset").output.startswith("datasets (")
    assert one_line_error(invoke("list", "nope")).startswith("error: nothing named 'nope' to list; give kinds")


def test_list_prints_every_default_as_a_toml_value_to_paste():
    from landscape.analyze.catalog import load_passes
    from landscape.config.recipe import registries

    lines = invoke("list").output.splitlines()
    checked = 0
    for registry in [*registries().values(), load_passes()]:
        # the registry's section (entries of two registries may share a name: dataset and model 'factory')
        header = "analysis passes" if registry.kind == "analysis pass" else f"{registry.kind}s ("
        section = next(i for i, line in enumerate(lines) if line.startswith(header))
        for entry in registry.entries():
            start = next(i for i, line in enumerate(lines) if i > section and line.startswith(f"  {entry.name} "))
            rest = lines[start][2 + len(entry.name):]
            column = 2 + len(entry.name) + len(rest) - len(rest.lstrip())  # where the summary starts
            block = []
            for line in lines[start + 1:]:
                if not line.startswith(" " * column):  # the next entry
                    break
                if line.startswith(" " * (column + 2)):  # an option (the summary's own lines at the column)
                    block.append(line.strip())
            parsed = tomllib.loads("\n".join(block))  # a recipe table's lines, as printed
            want = {k: list(v) if isinstance(v, tuple) else v for k, v in entry.option_defaults().items()}
            assert parsed == want, entry.name
            assert all(type(parsed[k]) is type(want[k]) for k in want), entry.name  # 1.0 stays a float
            checked += len(want)
    assert checked > 40


def test_toml_lines_write_nested_tables_as_dotted_keys():
    from landscape.cli.listing import _toml_lines

    values = {"a": {"b": 1, "c": {"d": [0.5, 2]}, "e": {}}, "s": 'say "x"', "on": True, "f": 1e-3, "n": None}
    lines = _toml_lines(values)
    assert lines[-1] == "# n: None (no TOML form; not settable in a recipe)"
    assert tomllib.loads("\n".join(lines)) == {k: v for k, v in values.items() if k != "n"}


def test_train_writes_a_run_directory(tmp_path):
    out = tmp_path / "run"
    result = invoke("train", *FAST, "--out", tmp_path, "--name", "run", "--set", "train.weight_decay=0.001", "--quiet")
    assert result.exit_code == 0, result.output
    assert f"run {out}: 2 rounds; test accuracy" in result.output
    assert sorted(p.name for p in out.iterdir()) == [".landscape-run", "checkpoints", "metrics.jsonl", "partition.json",
                                                     "recipe.toml"]
    recipe = (out / "recipe.toml").read_text()
    assert "weight_decay = 0.001" in recipe and "clients = 4" in recipe and "lr_schedule = \"constant\"" in recipe
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for key in ("lr", "train_loss", "test_loss", "test_acc", "flatness_distance", "update_norm", "seconds"):
        assert key in rows[-1]
    part = json.loads((out / "partition.json").read_text())
    assert part["num_clients"] == 4 and part["settings"]["name"] == "dirichlet-client-reuse"
    from landscape.data.partitions import heterogeneity

    hist = np.array([c["histogram"] for c in part["clients"]])
    indices, n = [np.array(c["indices"]) for c in part["clients"]], len(landscape.open_run(out).data()[0])
    assert part["heterogeneity"] == heterogeneity(hist, indices, n).record()
    assert part["heterogeneity"]["size_min"] == min(c["size"] for c in part["clients"])
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["round-0000.pt", "round-0002.pt"]


def test_recipe_file_and_flags(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('seed = 4\n[partition]\nclients = 6\n[train]\nrounds = 1\nlocal_steps = 1\n')
    result = invoke("train", recipe, "--clients", "5", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "seed = 4" in result.output and "clients = 5" in result.output
    assert "run directory: runs/digits-fedavg-dirr0.1-cnn-c5-s4" in result.output
    table, heterogeneity = result.output.split("heterogeneity: ")
    table = table.split("client")[-1].splitlines()[1:]
    assert [line.split()[0] for line in table if line.strip()] == ["0", "1", "2", "3", "4", "total"]
    assert heterogeneity.startswith("mean label TV distance from the global distribution 0.")
    assert "client sizes" in heterogeneity and "CV" in heterogeneity


def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = invoke("train", *FAST, "--out", out, "--dry-run")
    assert result.exit_code == 0
    assert " total" in result.output
    assert not out.exists()


BAD_INPUT = [
    (["--dataset", "imagenet"], "unknown dataset 'imagenet'; choose from: cifar10, cifar100, digits, factory, "
                                "fashion-mnist"),
    (["--model", "vit"], "unknown model 'vit'; choose from: cnn, factory, lenet5, mlp, resnet18"),
    (["--partition", "zipf"],
     "unknown partition 'zipf'; choose from: dirichlet, dirichlet-client, dirichlet-client-reuse, iid, natural, pathological"),
    (["--algorithm", "fedfoo"], "unknown algorithm 'fedfoo'; choose from: "),
    (["--alpha", "0"], "partition.alpha must be > 0 (got 0.0)"),
    (["--alpha", "-0.5"], "partition.alpha must be > 0 (got -0.5)"),
    (["--participation", "1.5"], "train.participation must be in (0, 1] (got 1.5)"),
    (["--participation", "0"], "train.participation must be in (0, 1] (got 0)"),
    (["--clients", "5000"], "5000 clients but only 1437 training samples"),
    (["--set", "train.lrr=0.1"], "unknown recipe key 'train.lrr'; allowed in [train]: rounds"),
    (["--set", "colour=red"], "unknown recipe key 'colour'; allowed top-level keys"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_one_line_nonzero_nothing_written(tmp_path, args, message):
    out = tmp_path / "run"
    result = invoke("train", *FAST, *args, "--out", out)
    assert result.exit_code != 0
    assert result.output.strip() == f"error: {message}" or result.output.startswith(f"error: {message}")
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "dataset, expected",
    [("mnist", "MNIST/raw/train-images-idx3-ubyte"), ("fashion-mnist", "FashionMNIST/raw/train-images-idx3-ubyte"),
     ("cifar10", "cifar-10-batches-py/data_batch_1"), ("cifar100", "cifar-100-python/train")],
)
def test_missing_dataset_files(tmp_path, dataset, expected):
    out = tmp_path / "run"
    result = invoke("train", *FAST, "--dataset", dataset, "--data-root", tmp_path / "data", "--out", out)
    assert result.exit_code != 0
    line = result.output.strip()
    assert len(line.splitlines()) == 1 and line.startswith(f"error: {dataset}: missing ")
    assert str(tmp_path / "data" / expected) in line and "--download" in line
    assert not out.exists()


def test_unknown_algorithm_lists_every_registered_one(tmp_path):
    from landscape.train.algorithms import ALGORITHMS

    result = invoke("train", "--algorithm", "fedfoo", "--out", tmp_path / "x")
    assert result.output.strip() == f"error: unknown algorithm 'fedfoo'; choose from: {', '.join(ALGORITHMS.names())}"


def test_sweep_from_comma_lists_skips_finished_and_resumes_unfinished(tmp_path):
    sweep = ["--alpha", "0.6,0.1", "--seed", "0,1", "--rounds", "2", "--clients", "4", "--participation", "0.5",
             "--local-steps", "1", "--device", "cpu", "--out", tmp_path, "--quiet"]
    listed = invoke("train", *sweep, "--dry-run")
    assert listed.exit_code == 0, listed.output
    names = [line.split()[1] for line in listed.output.strip().splitlines()]
    assert names == [str(tmp_path / f"digits-fedavg-dirr{a}-cnn-c4-s{s}") for a in ("0.6", "0.1") for s in (0, 1)]
    assert all(line.startswith("new") for line in listed.output.strip().splitlines())
    result = invoke("train", *sweep)
    assert result.exit_code == 0, result.output
    for name in names:
        assert (Path(name) / "checkpoints" / "round-0002.pt").is_file()
    # make one run look killed after round 1: drop its last checkpoint
    (Path(names[2]) / "checkpoints" / "round-0002.pt").unlink()
    listed = invoke("train", *sweep, "--dry-run").output.split()
    assert listed[0::2] == ["done", "done", "resume", "done"]
    stamp = (Path(names[0]) / "metrics.jsonl").stat().st_mtime_ns
    assert invoke("train", *sweep).exit_code == 0
    assert (Path(names[2]) / "checkpoints" / "round-0002.pt").is_file()
    assert (Path(names[0]) / "metrics.jsonl").stat().st_mtime_ns == stamp  # finished runs are not touched
    changed = invoke("train", *sweep, "--lr", "0.05")
    assert changed.exit_code != 0 and "holds a run of another recipe; pass --overwrite" in changed.output


def test_out_is_the_folder_of_the_runs_for_one_run_as_for_a_sweep(tmp_path):
    """--out means one thing: one run goes to <out>/<generated name>, as the sweep's run of the same values does,
    so adding --seed 0,1 to a one-run command keeps the folder's meaning; --name names a single run's directory."""
    one = invoke("train", *FAST, "--local-steps", "1", "--out", tmp_path, "--quiet")
    assert one.exit_code == 0, one.output
    run = tmp_path / "digits-fedavg-dirr0.1-cnn-c4-s0"
    assert one.output == f"run {run}: 2 rounds; test accuracy" + one.output.split("test accuracy")[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [run.name]
    swept = invoke("train", *FAST, "--local-steps", "1", "--seed", "0,1", "--out", tmp_path, "--dry-run")
    assert swept.output.split() == ["done", str(run), "new", str(tmp_path / "digits-fedavg-dirr0.1-cnn-c4-s1")]
    # the recipe's name is a prefix of the generated name, for one run as for each run of a sweep
    named = invoke("train", *FAST, "--set", "name=wd", "--out", tmp_path, "--dry-run").output
    assert f"# run directory: {tmp_path / 'wd-digits-fedavg-dirr0.1-cnn-c4-s0'} (new)" in named
    chosen = invoke("train", *FAST, "--out", tmp_path / "mine", "--name", "first", "--dry-run").output
    assert f"# run directory: {tmp_path / 'mine' / 'first'} (new)" in chosen
    assert "# run directory: runs/first (new)" in invoke("train", *FAST, "--name", "first", "--dry-run").output


@pytest.mark.parametrize("args, message", [
    (["--seed", "0,1", "--name", "x"], "--name names the directory of a single run, and this command makes 2 runs, "
                                       "each named <out>/<its generated name>: leave --name out (--set name=PREFIX "
                                       "puts PREFIX- before each generated name)"),
    (["--name", "../x"], "--name must be a plain folder name (letters, digits, '.', '_', '-'; no '/'; at most 200 "
                         "characters), got '../x'"),
    (["--name", ""], "--name must not be empty (leave it out for the generated name)"),
    (["--name", "a\nb"], "--name must not hold control characters (got 'a\\nb')"),
])
def test_a_bad_name_is_one_line(tmp_path, args, message):
    assert one_line_error(invoke("train", *FAST, *args, "--out", tmp_path, "--dry-run")) == f"error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_out_naming_a_run_directory_is_refused_with_the_commands_meant(tmp_path):
    """The old habit (--out runs/x for one run, its directory) on an existing run: refused, never a run nested
    inside a run; the line gives the command that continues it and the one that trains into it."""
    run = tmp_path / "x"
    assert invoke("train", *FAST, "--local-steps", "1", "--out", tmp_path, "--name", "x", "--quiet").exit_code == 0
    before = sorted(p.name for p in run.iterdir())
    for extra in ([], ["--seed", "0,1"]):
        line = one_line_error(invoke("train", *FAST, "--local-steps", "1", *extra, "--out", run, "--quiet"))
        assert line == (f"error: --out {run} is a run directory (it holds recipe.toml), and --out is the folder the "
                        f"runs go into (the run would be {run / 'digits-fedavg-dirr0.1-cnn-c4-s0'}): to continue that "
                        f"run, --resume {run}; to train into it, --out {tmp_path} --name x")
    assert sorted(p.name for p in run.iterdir()) == before
    line = one_line_error(invoke("train", "--resume", run, "--name", "y"))
    assert line == "error: --resume continues a run as recorded; only --rounds may be given with it, and --threads"


def test_overwrite_replaces_even_this_recipes_run_and_says_which(tmp_path):
    """--overwrite trains anew where a run directory exists (as the 'nothing to train' line promises), saying
    which directory it replaces and what it held, also with --quiet; a sweep's runs alike."""
    where = ["--local-steps", "1", "--out", tmp_path, "--name", "run"]
    assert invoke("train", *FAST, *where, "--quiet").exit_code == 0
    kept = invoke("train", *FAST, *where)
    assert "nothing to train (--overwrite trains it anew)" in kept.output
    (tmp_path / "run" / "metrics.jsonl").write_text("")  # a mark the new run does not keep
    assert "(replace)" in invoke("train", *FAST, *where, "--overwrite", "--dry-run").output
    again = invoke("train", *FAST, *where, "--overwrite", "--quiet")
    assert again.exit_code == 0, again.output
    assert again.stderr.splitlines() == [f"replacing {tmp_path / 'run'} (--overwrite): it holds this recipe's run, "
                                         "finished (round 2)"]
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in rows] == [1, 2]
    sweep = invoke("train", *FAST, "--local-steps", "1", "--seed", "0,1", "--out", tmp_path, "--overwrite",
                   "--dry-run")
    assert [line.split()[0] for line in sweep.output.splitlines()] == ["new", "new"]


def test_the_same_command_continues_an_interrupted_run_as_a_sweep_does(tmp_path):
    out, whole = tmp_path / "runs" / "digits-fedavg-dirr0.1-cnn-c4-s0", tmp_path / "whole"
    assert invoke("train", *FAST, "--out", tmp_path, "--name", "whole", "--quiet").exit_code == 0
    assert invoke("train", *FAST, "--out", tmp_path / "runs", "--quiet").exit_code == 0  # the generated name
    (out / "checkpoints" / "round-0002.pt").unlink()  # as if killed during round 2
    assert "(resume)" in invoke("train", *FAST, "--out", tmp_path / "runs", "--dry-run").output
    again = invoke("train", *FAST, "--out", tmp_path / "runs")
    assert again.exit_code == 0, again.output
    assert f"{out} holds this recipe's run, unfinished: continued from its last checkpoint (round 0)" in again.output
    for name in ("round-0002.pt",):  # ends as the uninterrupted run
        a, b = (torch.load(d / "checkpoints" / name, weights_only=True)["model"] for d in (out, whole))
        assert all(torch.equal(a[k], b[k]) for k in b)


def test_the_same_command_starts_again_a_run_killed_before_its_first_checkpoint(tmp_path):
    where = ["--local-steps", "1", "--out", tmp_path, "--name", "run"]
    assert invoke("train", *FAST, *where, "--quiet").exit_code == 0
    shutil.rmtree(tmp_path / "run" / "checkpoints")  # as if killed while round-0000.pt was written
    (tmp_path / "run" / "metrics.jsonl").unlink()
    again = invoke("train", *FAST, *where)
    assert again.exit_code == 0, again.output
    assert (f"{tmp_path / 'run'} holds this recipe's run, unfinished: started again from round 0 (it has no "
            "checkpoint)") in again.stderr.splitlines()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["round-0000.pt", "round-0002.pt"]


def test_existing_run_directory_is_not_touched(tmp_path):
    out, where = tmp_path / "run", ["--out", tmp_path, "--name", "run"]
    first = invoke("train", *FAST, *where, "--quiet")
    assert first.exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    again = invoke("train", *FAST, *where)  # the same command: the run is finished, nothing to train
    assert again.exit_code == 0, again.output
    assert f"{out} holds this recipe's run, finished: nothing to train" in again.output
    assert again.output.strip().splitlines()[-1] == first.output.strip()  # its result line, as it was
    result = invoke("train", *FAST, *where, "--quiet", "--lr", "0.05")  # another recipe
    assert result.exit_code != 0
    assert result.output.strip() == f"error: {out} holds a run of another recipe; pass --overwrite to replace it"
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # --overwrite replaces a run, but never a folder that is not one
    replaced = invoke("train", *FAST, *where, "--quiet", "--overwrite", "--seed", "1")
    assert replaced.exit_code == 0
    assert f"replacing {out} (--overwrite): it holds a run of another recipe (seed is 0 there, 1 here)" in (
        replaced.stderr.splitlines())  # said also with --quiet
    assert "seed = 1" in (out / "recipe.toml").read_text()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    result = invoke("train", *FAST, "--out", tmp_path, "--name", "notes", "--overwrite")
    assert result.exit_code != 0 and "not a run directory; --overwrite only replaces runs" in result.output
    assert (other / "thesis.tex").read_text() == "precious"


def test_resume_through_the_cli(tmp_path):
    out = tmp_path / "run"
    assert invoke("train", *FAST, "--out", tmp_path, "--name", "run", "--quiet").exit_code == 0
    result = invoke("train", "--resume", out, "--rounds", "3", "--quiet")
    assert result.exit_code == 0, result.output
    assert f"run {out}: 3 rounds" in result.output
    result = invoke("train", "--resume", out, "--lr", "0.5")
    assert result.exit_code != 0 and "only --rounds may be given with it" in result.output


def test_missing_recipe_file(tmp_path):
    result = invoke("train", tmp_path / "nope.toml")
    assert result.exit_code != 0 and result.output.strip() == f"error: recipe file not found: {tmp_path / 'nope.toml'}"


def test_real_subprocess(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "landscape", "train", *FAST, "--out", str(tmp_path), "--name", "run"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "round" in done.stderr  # the progress bar
    assert (out / "checkpoints" / "round-0002.pt").is_file()
    # a bad value's one-line error and exit status 1 are checked in-process (BAD_INPUT above); the
    # way out of the process is the same as for a good one


# The demo shrunk as any figure recipe is: --set over figures/demo.toml (4 clients, 2 rounds, a 3x3 surface, cheap
# pass options), S_rho at both rounds as the recipe's 10,20,30 at full size
DEMO_TINY = ["partition.clients=4", "train.rounds=2", "train.local_steps=2", "train.checkpoint_every=1",
             "surface.grid=3", "sharpness.rounds=1,2", "sharpness.clients=2", "sharpness.steps=1",
             "sharpness.adaptive=false", "hessian.clients=2", "hessian.trace_hvps=6", "hessian.density_steps=5",
             "hessian.density_runs=1", "hessian.top_k=2", "incompatibility.clients=2", "incompatibility.batches=2",
             "alignment.clients=2", "alignment.batches=2", "loss.clients=2", "analyze.analysis_samples=100"]


@pytest.mark.slow  # the demo's three runs, analysed and drawn (about 1 min)
def test_demo_and_report(tmp_path):
    sets = [arg for text in DEMO_TINY for arg in ("--set", text)]
    result = invoke("demo", "-o", tmp_path / "demo", "--quiet", *sets)
    assert result.exit_code == 0, result.output
    assert ": new" not in result.output and "%|" not in result.output  # --quiet: no progress lines or bars
    for name in ("surfaces", "surfaces-3d", "accuracy", "flatness-sharpness", "hessian", "alignment"):
        assert (tmp_path / "demo" / f"{name}.png").stat().st_size > 1000
    demo = load_figure_recipe(DEMO_FIGURE)
    for plot in demo.plots:  # as tests/figures/test_figures_book.py checks every other figure recipe's files
        for suffix in (".png", ".pdf"):
            assert (tmp_path / "demo" / f"{plot.file}{suffix}").stat().st_size > 5000, plot.file
        html = tmp_path / "demo" / f"{plot.file}.html"
        # one interactive page per view: the contour and 3D plots of the same surfaces share the first one's
        assert html.is_file() == (plot is next((p for p in demo.plots if p.kind in ("surfaces", "surfaces-3d")),
                                              None))
        if html.is_file():
            assert "Plotly.newPlot" in html.read_text() and "<script src=\"http" not in html.read_text()
    assert (tmp_path / "demo" / "compare.csv").is_file()
    assert "lambda_max" in result.output and "mean grad cos" in result.output  # the comparison table
    runs = sorted(p for p in (tmp_path / "demo" / "runs").iterdir() if p.is_dir())
    assert [run.name for run in runs] == ["fedavg", "fednsam", "fedsam"]  # the recipe's run ids
    for run in runs:  # S_rho at an earlier checkpoint too: a curve, not a point
        assert {p.parent.name for p in run.glob("analysis/round-*/sharpness*.json")} == {"round-0001", "round-0002"}
    html = (tmp_path / "demo" / "report.html").read_text()
    assert html.count("Plotly.newPlot") >= 3 and "fednsam" in html
    assert f"report:  {tmp_path / 'demo' / 'report.html'}" in result.output
    assert f"runs:    {tmp_path / 'demo' / 'runs' / 'fedavg'}, " in result.output
    again = invoke("demo", "--out", tmp_path / "demo", *sets)  # finished steps are reused (the lines say so)
    assert again.exit_code == 0 and again.output.count(": done") == 3
    def table(output: str) -> list[str]:  # the comparison table and what follows it
        lines = output.strip().splitlines()
        return lines[next(k for k, line in enumerate(lines) if line.startswith("run ") and "directory" in line):]

    assert table(again.output) == table(result.output)  # the same table, read again
    report = invoke("report", tmp_path / "demo" / "runs" / "fedsam", "-o", tmp_path / "r.html")
    assert report.exit_code == 0 and (tmp_path / "r.html").stat().st_size > 100_000
    missing = invoke("report", tmp_path / "nope", "-o", tmp_path / "x.html")
    assert missing.exit_code != 0 and missing.output.strip() == f"error: {tmp_path / 'nope'} is not a directory " \
        "(give run directories or folders of runs)"


@pytest.mark.parametrize("args", [["train", "--rounds", "1"], ["train", "--seed", "0,1", "--rounds", "1"],
                                  ["figures", str(DEMO_FIGURE.parent / "accuracy.toml")]],
                         ids=["one run", "sweep", "figures"])
def test_a_dry_run_refuses_the_device_the_run_would_refuse(tmp_path, args):
    result = invoke(*args, "--device", "mps", "--dry-run", "--out", tmp_path / "out")
    assert one_line_error(result) == "error: unsupported device 'mps'; use auto, cpu, cuda or cuda:N"
    assert not (tmp_path / "out").exists()


def test_demo_refuses_a_bad_set_in_one_line_before_training(tmp_path):
    result = invoke("demo", "-o", tmp_path / "demo", "--set", "sharpness.rounds=15")
    assert result.exit_code == 1 and not (tmp_path / "demo").exists()
    assert result.output.strip().startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert "demo.toml: analyze.sharpness.rounds: round 15 is not a checkpoint of run fedavg" in result.output
    unknown = invoke("demo", "-o", tmp_path / "demo", "--set", "trace.k=1")
    assert unknown.exit_code == 1 and len(unknown.output.strip().splitlines()) == 1, unknown.output


# ----------------------------------------------------------------------------------------------------------
# one meaning per flag: defaults in the help, --checkpoints, -o/--out, --quiet

# Every command but list writes output (analyze into the runs it reads) and may print progress or notes; a new
# command joins these checks by itself.
PROGRESS_COMMANDS = sorted(set(cli.commands) - {"list"})
WRITING_COMMANDS = sorted(set(PROGRESS_COMMANDS) - {"analyze"})


def option_help(command: str, flag: str) -> str:
    """The help of one option of `landscape COMMAND --help`, on one line."""
    output = invoke(command, "--help").output
    blocks = re.split(r"\n(?=  -)", output.split("Options:")[1])
    block = next(b for b in blocks if flag in [word.rstrip(",") for word in b.split()[:2]])
    return " ".join(block.split())


def test_train_help_shows_each_recipe_flags_default_from_the_default_recipe():
    from landscape.config.recipe import resolve

    defaults = resolve({})
    for flag, key, _ in _RECIPE_FLAGS:
        text = option_help("train", flag)
        default = "the algorithm's" if key == "algorithm.rho" else defaults.get(key)  # fedavg has no rho
        assert f"[default: {default}]" in text and key in text, text
    assert "[default: fedavg]" in option_help("train", "--algorithm")
    assert "[default: 0.1]" in option_help("train", "--alpha")  # the default partition's own option


def test_train_help_defaults_follow_the_recipe_not_a_copy(monkeypatch):
    import landscape.cli.train as cli_module
    from landscape.config import sections as recipe_sections

    monkeypatch.setattr(recipe_sections.TrainSettings.__dataclass_fields__["lr"], "default", 0.37)
    monkeypatch.setattr(cli_module, "_default_recipe", cli_module._default_recipe.__wrapped__)
    assert "[default: 0.37]" in option_help("train", "--lr")


def test_recipe_flags_not_given_leave_the_recipe_files_values(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[algorithm]\nname = "fedsam"\n[train]\nlr = 0.05\nrounds = 3\nthreads = 2\n')
    result = invoke("train", recipe, "--dry-run")
    assert result.exit_code == 0, result.output
    for line in ('name = "fedsam"', "lr = 0.05", "rounds = 3", "threads = 2"):
        assert line in result.output.splitlines()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny runs with kept client models, trained as a sweep into the folder given by -o."""
    parent = tmp_path_factory.mktemp("runs")
    result = invoke("train", *FAST, "--seed", "0,1", "--keep-clients", "-o", parent, "--quiet")
    assert result.exit_code == 0, result.output
    runs = sorted(p for p in parent.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["digits-fedavg-dirr0.1-cnn-c4-s0",
                                        "digits-fedavg-dirr0.1-cnn-c4-s1"]
    # --quiet: the result lines only, no "[1/2] new: ..." progress lines and no progress bar
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"run {p}: 2 rounds; test accuracy") for p, line in zip(runs, lines))
    return runs


def copied(runs, tmp_path):
    return [Path(shutil.copytree(run, tmp_path / run.name)) for run in runs]


def test_analyze_checkpoints_picks_the_rounds(two_runs, tmp_path):
    (run, _) = copied(two_runs, tmp_path)
    result = invoke("analyze", run, "--checkpoints", "0,2", "--passes", "loss", "--analysis-samples", "50",
                    "--device", "cpu", "--quiet")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (run / "analysis").iterdir()) == ["round-0000", "round-0002"]
    assert "2 computed" in result.output
    help_text = option_help("analyze", "--checkpoints")
    assert "last, all, or a comma list" in help_text and "[default: last]" in help_text
    assert "--rounds" not in invoke("analyze", "--help").output


@pytest.mark.parametrize("value", ["all", "10,20", "last"])
def test_analyze_rounds_is_refused_in_one_line_naming_checkpoints(two_runs, tmp_path, value):
    (run, _) = copied(two_runs, tmp_path)
    result = invoke("analyze", run, "--rounds", value, "--passes", "loss", "--device", "cpu")
    assert result.exit_code == 1
    assert result.output == ("error: analyze picks checkpoints with --checkpoints (last, all, or a comma list of "
                             f"rounds), not --rounds: use --checkpoints {value}\n")
    assert not (run / "analysis").exists()


def test_bad_checkpoints_name_the_flag(two_runs):
    result = invoke("analyze", two_runs[0], "--checkpoints", "first", "--passes", "loss", "--device", "cpu")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "--checkpoints" in result.output and "(got 'first')" in result.output


@pytest.mark.parametrize("command", WRITING_COMMANDS)
def test_every_writing_command_takes_o_and_out(command):
    assert "-o, --out" in invoke(command, "--help").output


def test_analyze_has_no_output_option():
    assert not {"-o", "-o,", "--out"} & set(invoke("analyze", "--help").output.split())  # it writes into the runs


def test_o_means_out_on_compare_report_and_figures(two_runs, tmp_path):
    compared = invoke("compare", *two_runs, "-o", tmp_path / "cmp", "--quiet")
    assert compared.exit_code == 0, compared.output
    assert (tmp_path / "cmp" / "compare.csv").is_file()
    report = invoke("report", *two_runs, "-o", tmp_path / "r.html", "--quiet")
    assert report.exit_code == 0 and report.output == f"report: {tmp_path / 'r.html'}\n"
    assert (tmp_path / "r.html").stat().st_size > 10_000
    recipe = Path(__file__).resolve().parents[2] / "figures" / "accuracy.toml"
    planned = invoke("figures", recipe, "--runs", two_runs[0], "-o", tmp_path / "fig", "--dry-run")
    assert planned.exit_code == 0, planned.output
    assert f"{tmp_path / 'fig' / 'accuracy'}.png|pdf" in planned.output


@pytest.mark.parametrize("command", PROGRESS_COMMANDS)
def test_every_command_takes_quiet(command):
    assert "--quiet" in invoke(command, "--help").output


def test_quiet_silences_progress_but_not_results(tmp_path):
    loud = invoke("train", *FAST, "-o", tmp_path, "--name", "loud")
    quiet = invoke("train", *FAST, "-o", tmp_path, "--name", "quiet", "--quiet")
    assert loud.exit_code == quiet.exit_code == 0
    assert "2/2 [" in loud.output and "round/s" in loud.output  # the progress bar
    assert quiet.output.startswith(f"run {tmp_path / 'quiet'}: 2 rounds; test accuracy")
    assert len(quiet.output.strip().splitlines()) == 1
    bad = invoke("train", *FAST, "--alpha", "0", "-o", tmp_path / "bad", "--quiet")  # errors stay
    assert bad.exit_code == 1 and bad.output == "error: partition.alpha must be > 0 (got 0.0)\n"


def test_quiet_silences_analyze_notes_and_bars(two_runs, tmp_path):
    (run, _) = copied(two_runs, tmp_path)
    args = ["analyze", run, "--checkpoints", "all", "--passes", "flatness", "--device", "cpu"]
    loud = invoke(*args)
    assert loud.exit_code == 0, loud.output
    assert "note: " in loud.output and "skipped at round 0" in loud.output and "analyze:" in loud.output
    quiet = invoke(*args, "--force", "--quiet")
    assert quiet.exit_code == 0, quiet.output
    assert "note:" not in quiet.output and "analyze:" not in quiet.output and "%|" not in quiet.output
    assert "Delta_D" in quiet.output and quiet.output.endswith("1 computed, 0 already done (same settings)\n")


def test_quiet_silences_compare_notes(two_runs, tmp_path):
    loud = invoke("compare", *two_runs, "-o", tmp_path / "a")
    quiet = invoke("compare", *two_runs, "-o", tmp_path / "b", "--quiet")
    assert loud.exit_code == quiet.exit_code == 0
    assert "note: run digits-fedavg-dirr0.1-cnn-c4-s0 has no" in loud.output
    assert "note:" not in quiet.output
    kept = [line for line in loud.output.replace(str(tmp_path / "a"), str(tmp_path / "b")).splitlines()
            if not line.startswith("note:")]
    assert quiet.output.splitlines() == kept  # the table, its settings line and what was written stay
    assert quiet.output.endswith(f"wrote {tmp_path / 'b' / 'compare.csv'}\n")
