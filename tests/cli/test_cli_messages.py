"""The command line's messages (issue 20, round 3): an empty --passes, --set keys that are tables or unknown,
figure and claim recipes checked before anything is trained, and printed commands that paste as they are."""

from __future__ import annotations

import re
import shlex

import pytest
from support.helpers import invoke, one_line_error, tiny_recipe

from landscape.config import overrides as recipe_overrides
from landscape.core.errors import LandscapeError


@pytest.mark.parametrize("given", ["", ",", " , "])
def test_empty_pass_list_names_the_passes(given, tmp_path):
    from landscape.analyze.catalog import load_passes

    line = one_line_error(invoke("analyze", tmp_path / "run", "--passes", given, "--dry-run"))
    assert f"--passes {given!r} names no pass" in line
    assert ", ".join(load_passes().names()) in line and "client" not in line


@pytest.mark.parametrize("assignment, expected", [
    ("train.foo.bar=1", "unknown recipe key 'train.foo'; allowed in [train]: rounds, "),
    ("train.local_epoch=2", "did you mean 'train.local_epochs'?"),
    ("sed=3", "did you mean 'seed'?"),
    ("train.lr.x=1", "recipe key 'train.lr' is a value, not a table: set train.lr=VALUE"),
    ("seed.x=1", "recipe key 'seed' is a value, not a table: set seed=VALUE"),
    ("train=1", "recipe key 'train' is a table ([train]): set one of its keys, e.g. train.lr=0.05"),
    ("dataset=1", "e.g. dataset.name=mnist1d"),
    ("partition=1", "e.g. partition.clients=10"),
    ("model=1", "e.g. model.name=mlp"),
    ("algorithm=1", "e.g. algorithm.name=fedsam"),
])
def test_set_names_the_key_and_suggests_keys_that_exist(assignment, expected):
    line = one_line_error(invoke("train", "--set", assignment, "--dry-run"))
    assert expected in line, line
    assert ".name" not in line or not line.startswith("error: recipe key 'train'")
    example = re.search(r"e\.g\. (\S+)$", line)
    if example:  # the suggested key exists: a recipe with it resolves
        key, value = recipe_overrides.parse_assignment(example.group(1))
        assert recipe_overrides.build(None, [(key, value)]).get(key) == value
    close = re.search(r"did you mean '([^']+)'\?", line)
    if close:
        recipe_overrides.build(None, [(close.group(1), recipe_overrides.parse_assignment(assignment)[1])])


TRAIN = """
[partition]
clients = 4
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 3
local_steps = 1
batch_size = 16
checkpoint_every = 2
eval_every = 2
"""

FIGURE = """
name = "tiny"
[[runs]]
id = "avg"
set = { "algorithm.name" = "fedavg" }
[[runs]]
id = "sam"
set = { "algorithm.name" = "fedsam" }
[digits.train]
recipe = "train.toml"
"""

HESSIAN_PLOT = '[analyze.hessian]\ntop_k = 1\n{rounds}\n[[plots]]\nkind = "hessian"\n'
CLAIM = 'claim = "x"\nfigure = "fig.toml"\nseeds = [0, 1]\n[[compare]]\nlower = "sam"\nhigher = "avg"\n'


# (figure recipe's extra lines, claim's comparison lines or None for `landscape figures`, what the line says)
BEFORE_TRAINING = [
    ('[[plots]]\nkind = "metric"\nkey = "test_accuracy"\n', None,
     "fig.toml: plots[0].key must be a metrics.jsonl key (lr, train_loss, "),
    (HESSIAN_PLOT.format(rounds="rounds = [999]"), None,
     "fig.toml: analyze.hessian.rounds: round 999 is not a checkpoint of run avg (checkpoints at rounds 0, 2, 3"),
    (HESSIAN_PLOT.format(rounds="rounds = [0, 1]"), None,
     "fig.toml: analyze.hessian.rounds: round 1 is not a checkpoint of run avg (checkpoints at rounds 0, 2, 3;"),
    (HESSIAN_PLOT.format(rounds='rounds = "last 4"'), None,
     "fig.toml: analyze.hessian.rounds: last 4 asks for 4 checkpoints, more than those of run avg (checkpoints at "
     "rounds 0, 2, 3;"),
    ('[[plots]]\nkind = "accuracy"\n', 'quantity = "test_acc"\nrounds = "2, 9"\n',
     "c.toml: [[compare]] 1: rounds '2, 9': run sam seed 0 has test_acc at rounds 2, 3 (train.rounds = 3)"),
    ('[[plots]]\nkind = "accuracy"\n', 'quantity = "lambda_mx"\nrounds = "last"\n',
     "c.toml: [[compare]] 1: quantity 'lambda_mx' is neither a metrics.jsonl key (lr, train_loss, "),
    ('[[plots]]\nkind = "accuracy"\n', 'quantity = "test_acc"\nrounds = [999]\n',
     "c.toml: [[compare]] 1: rounds [999]: run sam seed 0 has test_acc at rounds 2, 3 (train.rounds = 3)"),
    ('[[plots]]\nkind = "accuracy"\n', 'quantity = "train_loss"\nrounds = "last 5"\n',
     "c.toml: [[compare]] 1: rounds 'last 5': run sam seed 0 has train_loss at rounds 1..3 (train.rounds = 3)"),
    (HESSIAN_PLOT.format(rounds=""), 'quantity = "lambda_max"\nrounds = [2]\n',
     ("c.toml: [[compare]] 1: rounds [2]: run sam seed 0 has lambda_max at rounds 3 (the figure analyses "
      "hessian at rounds last)")),
    ('[[plots]]\nkind = "accuracy"\n', 'quantity = "swa_models"\nrounds = "last"\n',
     ("c.toml: [[compare]] 1: rounds 'last': run sam seed 0 has swa_models at no round (train.rounds = 3; "
      "swa_models is logged with train.swa = true)")),
]


@pytest.mark.parametrize("figure, comparison, expected", BEFORE_TRAINING)
@pytest.mark.parametrize("dry_run", [True, False])
def test_figure_and_claim_recipes_are_checked_before_training(figure, comparison, expected, dry_run, tmp_path):
    (tmp_path / "train.toml").write_text(TRAIN)
    (tmp_path / "fig.toml").write_text(FIGURE + figure)
    out = tmp_path / "out"
    if comparison is None:
        args = ["figures", tmp_path / "fig.toml", "-o", out]
    else:
        (tmp_path / "c.toml").write_text(CLAIM + comparison)
        args = ["claims", tmp_path / "c.toml", "-o", out, "--figures-out", out]
    line = one_line_error(invoke(*args, "--device", "cpu", "--quiet", *(["--dry-run"] if dry_run else [])))
    assert f"{tmp_path}/{expected}" in line, line
    assert not out.exists()  # nothing was trained


@pytest.fixture
def spaced_run(one_round_run):
    """A 1-round run in a folder whose path holds a space (the session's, copied before use)."""
    assert " " in str(one_round_run)
    return one_round_run


def _pasted(text: str) -> list[str]:
    """The words of the first `landscape ...` command in ``text``, split as a shell splits them."""
    command = re.search(r"`(landscape [^`]+)`", text) or re.search(r"(landscape train --resume .*?) (?:writes|to)",
                                                                    text)
    assert command, text
    return shlex.split(command.group(1))


@pytest.mark.parametrize("case", ["train again", "compare", "report note", "missing pass", "missing round",
                                  "partition"])
def test_printed_commands_are_shell_quoted(case, spaced_run, tmp_path):
    import html as html_text
    import shutil

    from landscape.figures.compare import compare
    from landscape.figures.rundata import load_runs

    run = tmp_path / "a copy" / "my run"
    shutil.copytree(spaced_run, run)
    if case == "train again":  # a new run started in a run's directory (landscape.train.loop.start_run)
        from landscape.store.directory import RunDir
        from landscape.store.lifecycle import check_out_dir

        with pytest.raises(LandscapeError) as e:
            check_out_dir(RunDir(run), overwrite=False)
        words = shlex.split(str(e.value).split("pass ")[1].split(" to continue")[0])
        assert words == ["--resume", str(run)]
        return
    if case == "compare":
        shutil.copytree(spaced_run, run.parent / "other run")
        text = "\n".join(compare([run, run.parent / "other run"], tmp_path / "cmp").missing)
    elif case == "report note":
        from landscape.figures.report.build import write_report

        html = write_report([run], tmp_path / "r.html").read_text()
        text = re.search(r"no analysis yet; run (`[^`]+`)", html_text.unescape(html)).group(1)
    elif case in ("missing pass", "missing round"):
        with pytest.raises(LandscapeError) as e:
            loaded = load_runs([run])[0]
            if case == "missing round":
                loaded.analyses[1] = {"hessian": None}  # analysed at round 1 only, asked for round 0
            loaded.pass_record("hessian", 0 if case == "missing round" else None)
        text = str(e.value)
    else:
        from landscape.store.run import open_run

        (run / "partition.json").unlink()
        with pytest.raises(LandscapeError) as e:
            open_run(run).partition()
        text = str(e.value)
    words = _pasted(text)
    assert words[:2] == ["landscape", "analyze"] or words[:3] == ["landscape", "train", "--resume"]
    assert str(run) in words, (words, text)


@pytest.mark.parametrize("assignment, expected", [
    ("hessian.top_k=nan", "hessian.top_k must be an integer (got nan)"),
    ("hessian.top_k=inf", "hessian.top_k must be an integer (got inf)"),
    ("sharpness.rhos=[-0.05]", "sharpness.rhos[0] must be > 0 (got -0.05)"),
    ("sharpness.rhos=[0.05, 0]", "sharpness.rhos[1] must be > 0 (got 0)"),
    ("sharpness.local_rho=-0.05", "sharpness.local_rho must be > 0 (got -0.05)"),
    ("sharpness.starts=0", "sharpness.starts must be > 0 (got 0)"),
    ("sharpness.steps=-3", "sharpness.steps must be > 0 (got -3)"),
    ("sharpness.tol=-1.0", "sharpness.tol must be >= 0 (0: run all steps) (got -1.0)"),
    ("sharpness.clients=-1", "sharpness.clients must be >= 0 (0: all clients) (got -1)"),
    ("incompatibility.rho=0.0", "incompatibility.rho must be > 0 (got 0.0)"),
    ("alignment.batches=-2", "alignment.batches must be > 0 (got -2)"),
])
@pytest.mark.parametrize("route", ["--set", "analysis recipe"])
def test_pass_options_out_of_bounds_are_refused_before_the_plan(assignment, expected, route, tmp_path):
    key, value = assignment.split("=")
    pass_name, option = key.split(".")
    if route == "--set":
        given = ["--set", assignment]
    else:
        (tmp_path / "a.toml").write_text(f"[{pass_name}]\n{option} = {value}\n")
        given = [tmp_path / "a.toml"]
        expected = f"{tmp_path / 'a.toml'}: {expected}"  # the recipe's file named
    run = tmp_path / "no run"  # refused before the run is looked at, also with --dry-run
    line = one_line_error(invoke("analyze", run, *given, "--passes", pass_name, "--dry-run"))
    assert line == f"error: {expected}"


@pytest.mark.parametrize("swa", [False, True])
def test_the_rounds_checked_are_the_rounds_a_run_writes(swa, tmp_path):
    """METRIC_KEYS, logged_rounds and checkpoint_rounds against the files a trained run holds."""
    import json

    from landscape.figures.recipe import figure as figure_recipe
    from landscape.figures.recipe import rounds as figure_rounds
    from landscape.train import loop

    recipe = tiny_recipe(train__rounds=5, train__eval_every=2, train__checkpoint_every=2, train__swa=swa,
                         train__swa_start=0.0, train__swa_cycle=1)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    numbers = {key for row in rows for key, value in row.items() if isinstance(value, (int, float))} - {"round"}
    assert numbers == set(figure_recipe.METRIC_KEYS) - ({"swa_models"} if not swa else set())
    for key in figure_recipe.METRIC_KEYS:
        assert (figure_rounds.logged_rounds(key, recipe.train)
                == [row["round"] for row in rows if key in row]), key
    files = sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "run" / "checkpoints").glob("round-*.pt")
                   if ".clients" not in p.name)
    assert figure_rounds.checkpoint_rounds(recipe.train) == files == [0, 2, 4, 5]
