"""The train and analyze commands as a newcomer types them (issue 22): --rho, a decimal comma refused, rounds
where a pass cannot run skipped with one note (PCA before 3 checkpoints, clients not kept or not sampled), an
analysis recipe and the default passes on a run without kept clients, and a subset larger than its split."""

import json
from pathlib import Path

import pytest
from support.helpers import invoke, one_line_error, tiny_recipe

import landscape
from landscape.analyze.source import find_sources
from landscape.train import loop

ALGORITHMS_WITH_RHO = ("fedasam, fedgamma, fedlesam, fednsam, fednsam-code, fedsam, fedsmoo, fedvssam, "
                       "mofedsam")

# ----------------------------------------------------------------------------------------------------------
# landscape train: --rho, a decimal comma, a key's closest spelling


@pytest.mark.parametrize("flag, value, point", [("--lr", "0,05", "0.05"), ("--alpha", "0,1", "0.1"),
                                                ("--participation", "0,25", "0.25"), ("--rho", "1,05", "1.05")])
def test_a_decimal_comma_is_refused_with_a_hint(flag, value, point):
    line = one_line_error(invoke("train", "--algorithm", "fedsam", flag, value, "--dry-run"))
    assert line == (f"error: {flag} {value} looks like a decimal comma: use a decimal point ({point}); a sweep is "
                    f"a comma list of values, e.g. {flag} 0.01,0.05")


def test_comma_lists_that_are_no_decimal_comma_still_sweep(tmp_path):
    for args in (["--lr", "0.01,0.05"], ["--lr", "1,5"], ["--seed", "0,1"]):  # --seed: a whole number
        result = invoke("train", *args, "--dry-run", "-o", tmp_path)
        assert result.exit_code == 0, result.output
        assert len(result.output.strip().splitlines()) == 2, result.output


def test_an_unknown_train_key_suggests_the_closest():
    line = one_line_error(invoke("train", "--set", "train.local_epoch=2", "--dry-run"))
    assert line.startswith("error: unknown recipe key 'train.local_epoch'")
    assert line.endswith("did you mean 'train.local_epochs'?")


def test_rho_sets_the_algorithms_option(tmp_path):
    result = invoke("train", "--algorithm", "fedsam", "--rho", "0.05", "--clients", "4", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "\n[algorithm]\nname = \"fedsam\"\nrho = 0.05\n" in result.output
    sweep = invoke("train", "--algorithm", "fedsam,fednsam", "--rho", "0.01,0.05", "--dry-run", "-o", tmp_path)
    assert sweep.exit_code == 0, sweep.output
    names = sorted(line.split("/")[-1] for line in sweep.output.strip().splitlines())
    assert names == sorted(f"digits-{a}-dirr0.1-cnn-c20-s0-rho{r}" for a in ("fedsam", "fednsam")
                           for r in ("0.01", "0.05"))


def test_rho_for_an_algorithm_without_one_is_one_line():
    for args in (["--rho", "0.05"], ["--algorithm", "fedavg,fedsam", "--rho", "0.05"]):
        line = one_line_error(invoke("train", *args, "--dry-run"))
        assert line == ("error: --rho sets the algorithm's rho (algorithm.<name>.rho), and fedavg has none; the "
                        f"algorithms with one: {ALGORITHMS_WITH_RHO}")


# ----------------------------------------------------------------------------------------------------------
# landscape analyze: what cannot run at a round is skipped with one note, the rest computed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of 3 rounds, every round checkpointed, 2 of 4 clients sampled a round: without and with kept
    clients."""
    root = tmp_path_factory.mktemp("first-hour")
    for name, keep in (("plain", False), ("kept", True)):
        loop.start_run(tiny_recipe(train__keep_clients=keep, model__name="mlp", model__hidden=[16]), root / name,
                       progress=False)
    return root


def _analyze(path, *args, quiet=False):
    result = invoke("analyze", path, "--device", "cpu", "--analysis-samples", "100", *args,
                    *(["--quiet"] if quiet else []))
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    return result, notes


def test_pca_of_every_round_skips_the_rounds_before_three_checkpoints(runs, tmp_path):
    import shutil

    run = shutil.copytree(runs / "plain", tmp_path / "plain")
    result, notes = _analyze(run, "--passes", "surface", "--directions", "pca", "--checkpoints", "all",
                             "--grid", "3")
    assert result.exit_code == 0, result.output
    assert notes == ["note: plain: surface --directions pca skipped at rounds 0, 1: the PCA of the trajectory "
                     "needs 3 checkpoints up to the round"], result.output
    assert "2 computed" in result.output
    for r in (2, 3):
        assert list((run / "analysis" / f"round-{r:04d}").glob("surface-pca*.json"))


def test_client_passes_are_skipped_on_a_run_without_kept_clients(runs, tmp_path):
    """An analysis recipe (analyze/quick.toml) and the default passes run what needs no kept client models, the
    flatness pass is skipped with one note; --backend pyhessian too."""
    import shutil

    run = shutil.copytree(runs / "plain", tmp_path / "plain")
    quick = ("--set", "hessian.trace_hvps=6", "--set", "hessian.density_steps=5", "--set", "hessian.clients=2")
    quick_toml = str(Path(__file__).parents[2] / "analyze" / "quick.toml")
    for args in ([quick_toml, *quick], ["--backend", "pyhessian", "--passes", "loss,flatness"]):
        result, notes = _analyze(run, *args)
        assert result.exit_code == 0, result.output
        assert notes == ["note: plain: flatness skipped at round 3: no client models were kept (train with "
                         "--keep-clients to save them at checkpoints)"], result.output
        assert not list((run / "analysis" / "round-0003").glob("flatness*"))
    written = {json.loads(p.read_text())["pass"] for p in (run / "analysis" / "round-0003").glob("*.json")}
    assert written == {"loss", "hessian", "sharpness", "incompatibility", "alignment"}


def test_a_named_client_not_sampled_in_the_round_is_one_line_naming_the_kept_ones(runs, tmp_path):
    import shutil

    run = shutil.copytree(runs / "kept", tmp_path / "kept")
    (source,), _ = find_sources(run)
    kept = source.kept_client_ids(3)
    assert len(kept) == 2
    other = min(set(range(4)) - set(kept))
    listed = ", ".join(map(str, kept))
    for args in (["--directions", "clients", "--set", f"surface.clients={kept[0]},{other}"],
                 ["--directions", "interpolate", "--set", f"surface.target=client:{other}"]):
        line = one_line_error(_analyze(run, *args, "--grid", "5", quiet=True)[0])
        assert line.endswith(f"skipped at round 3: client {other} was not sampled in that round (no kept model); "
                             f"kept clients there: {listed}"), line
        assert line.startswith("error: nothing to analyse: kept: surface --directions "), line
    # the default target is a kept client
    result, _ = _analyze(run, "--directions", "interpolate", "--grid", "5", quiet=True)
    assert result.exit_code == 0, result.output
    (path,) = (run / "analysis" / "round-0003").glob("surface-interpolate*.json")
    assert json.loads(path.read_text())["result"]["target"] == f"client:{kept[0]}"


def test_a_subset_larger_than_the_split_is_said_to_be_all_of_it(runs, tmp_path):
    import shutil

    run = shutil.copytree(runs / "plain", tmp_path / "plain")
    size = len(landscape.open_run(run).data()[1])
    result = invoke("analyze", run, "--device", "cpu", "--quiet", "--passes", "loss", "--split", "test",
                    "--analysis-samples", "100000")
    assert result.exit_code == 0, result.output
    assert f"on the test set, all {size} samples (fewer than 100000)" in " ".join(result.output.split())
    assert "subset" not in result.output
