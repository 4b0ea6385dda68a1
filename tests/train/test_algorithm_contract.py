"""The contract every registered algorithm keeps: it resumes bit-identically from a checkpoint mid-run, keeps
the state docs/algorithms.md says it keeps, its server rule reduces to its stated rule on hand-made uploads,
and its uplink float count is the floats of its upload (the table's count); plus its display label, and the
loading of checkpoints written before state was typed (their state tables keep the field names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from support.algorithm_checks import DIM, linear_trainer
from support.helpers import tiny_recipe

from landscape.config import recipe as recipes
from landscape.core.perturb import normalized
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop
from landscape.train.algorithms import ALGORITHMS, NoState, ServerRound, build_algorithm

ROOT = Path(__file__).resolve().parents[2]
# Round 2 of 4-round runs (4 digits clients, mlp without hidden layers, float32) written by the code of commit
# 3816034, whose algorithm state was plain tables: dynsam (all clients; long, scalar and vector statistics)
# and fedsmoo (two server tensors; two tensors for each client that took part).
EARLIER = ROOT / "tests" / "fixtures" / "checkpoints"

# Options that make the rounds after the cut use the state (dynsam past its warm-up on both sides of it).
OPTIONS = {"fedacg": {"beta": 0.01}, "fedgamma": {"rho": 0.05}, "mofedsam": {"alpha": 0.5},
           "fedlesam": {"rho": 0.1}, "dynsam": {"warmup": 1, "history": 3}}
CASES = [(name, OPTIONS.get(name, {})) for name in ALGORITHMS.names()] + [
    ("fednsam-code", {"server": "latest-revision"})]


def case_id(case) -> str:
    name, options = case
    return name + "".join(f"-{k}={v}" for k, v in options.items() if k == "server")


def documented(page: str = "docs/algorithms.md", header: str = "| name | server state") -> dict[str, dict[str, str]]:
    """The rows of a page's table of algorithms (docs/algorithms.md's by default): name -> column -> cell."""
    lines = (ROOT / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))

    def cells(line: str) -> list[str]:  # split at the bars, not at an escaped one (\|g\| in a formula)
        return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]

    header = cells(lines[start])
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = cells(line)
        rows[row[0].strip("`")] = dict(zip(header, row))
    return rows


def test_every_algorithm_has_its_label_its_code_and_its_row_in_the_documentation():
    assert ALGORITHMS.names() == sorted(documented())
    for entry in ALGORITHMS.entries():
        assert entry.label and entry.factory is not None, entry.name
        assert entry.factory.name == entry.name and entry.factory.label == entry.label


def _documented_defaults(cell: str) -> dict[str, str]:
    """The options and defaults of one cell of the training guide's table: "`rho` 0.1", "`a, b, c` 0.4, 0.5, 0.1",
    "`lambda_min/max` 0.01/0.3", "`gamma_l` 0.4 (0.1 for ...)" -> {name: value as printed}."""
    defaults = {}
    for keys, values in re.findall(r"`([^`]+)` ([^`]+?)(?:,\s*(?=`)|$)", cell):
        names = [k.strip() for k in keys.split(",")]
        if len(names) == 1 and "/" in names[0]:  # lambda_min/max
            stem, first, second = re.fullmatch(r"(.*_)(\w+)/(\w+)", names[0]).groups()
            names = [stem + first, stem + second]
        shown = re.split(r"\s*[,/]\s*", re.sub(r"\s*\(.*\)", "", values).strip())
        assert len(shown) == len(names), (cell, keys, values)
        defaults.update(zip(names, shown))
    return defaults


def test_the_training_guides_table_of_algorithms_is_the_registry():
    """docs/guides/train.md's table: every algorithm, the defaults it prints are the options' defaults, and its
    uplink multiple is docs/algorithms.md's (which the uplink test below checks against the uploads)."""
    guide = documented("docs/guides/train.md", "| name | rule | options")
    assert sorted(guide) == sorted(set(ALGORITHMS.names()) | {"fednsam-code"})
    uplinks = {name: row["uplink (floats)"] for name, row in documented().items()}
    for name, row in guide.items():
        entry = ALGORITHMS.get(name)
        defaults = entry.option_defaults()
        for option, shown in _documented_defaults(row["options (defaults)"]).items():
            assert option in defaults, (name, option)
            value = defaults[option]
            assert (str(value) == shown if isinstance(value, str) else float(value) == float(shown)), \
                (name, option, shown, value)
        multiple = re.fullmatch(r"\$(\d*)d\$", uplinks[name])[1] or "1"
        assert row["uplink"] == f"{multiple}x", (name, row["uplink"], uplinks[name])


# ----------------------------------------------------------------------------------------------------------
# resume


def whole_and_resumed(tmp_path, recipe_for_rounds) -> tuple[dict, dict]:
    """Final checkpoints of 4 uninterrupted rounds and of 2 rounds resumed to 4 (checkpoint_every 2)."""
    loop.start_run(recipe_for_rounds(4), tmp_path / "whole", progress=False)
    loop.start_run(recipe_for_rounds(2), tmp_path / "cut", progress=False)
    loop.resume_run(tmp_path / "cut", rounds=4, progress=False)
    return (load_checkpoint(RunDir(tmp_path / "whole").checkpoint(4)),
            load_checkpoint(RunDir(tmp_path / "cut").checkpoint(4)))


def assert_same_state(a: dict, b: dict) -> None:
    """Model, server state and every client state of two checkpoints are bit-identical."""
    for key in ("model", "server_state"):
        assert a[key].keys() == b[key].keys()
        assert all(torch.equal(a[key][k], b[key][k]) for k in a[key])
    assert a["client_states"].keys() == b["client_states"].keys()
    for client, state in a["client_states"].items():
        assert state.keys() == b["client_states"][client].keys()
        assert all(torch.equal(v, b["client_states"][client][k]) for k, v in state.items())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_resumes_bit_identically_and_keeps_the_state_it_declares(tmp_path, case):
    name, options = case

    def recipe(rounds):
        return tiny_recipe(algorithm__name=name, train__rounds=rounds, train__checkpoint_every=2,
                           train__weight_decay=0.01, model__name="mlp",
                           train__participation=1.0 if name == "dynsam" else 0.5,
                           **{f"algorithm__{k}": v for k, v in options.items()})

    whole, resumed = whole_and_resumed(tmp_path, recipe)
    assert_same_state(whole, resumed)
    algorithm, row = ALGORITHMS.get(name).factory, documented()[name]
    # What it keeps: its state classes' fields, in its checkpoints; none where the table says "-".
    assert list(whole["server_state"]) == algorithm.ServerState.names()
    assert (algorithm.ServerState is NoState) == (row["server state"] == "-")
    assert all(list(state) == algorithm.ClientState.names() for state in whole["client_states"].values())
    keeps_client_state = algorithm.ClientState is not NoState
    assert bool(whole["client_states"]) == keeps_client_state == (row["client state"] != "-")


# ----------------------------------------------------------------------------------------------------------
# the server rule on hand-made uploads


def fedavg_step(a, x, uploads):  # x^{t+1} = x^t + eta_g * mean_S(y_{i,K} - x^t)
    return x + a.server_lr * (torch.stack([u.model for u in uploads]).mean(0) - x)


def mean_y(uploads):
    return torch.stack([u.model for u in uploads]).mean(0)


def nsam_code(a, x, s, uploads, r):
    lam = a.options.lam
    start = x + lam * s.m  # x~
    if a.options.server == "momentum":
        m = lam * s.m + (mean_y(uploads) - start)
    else:  # latest revision: m^0 = Delta_bar^0, then (1 + lam) Delta_bar
        m = (mean_y(uploads) - start) * (1 if r.round == 0 else 1 + lam)
    return x + a.server_lr * m, {"m": m}


def fedsmoo(a, x, s, uploads, r):
    h_sum = s.h_sum + sum(u.model - x for u in uploads)  # H += Delta_i
    mu = torch.stack([u.mu for u in uploads]).mean(0)
    return (x + a.server_lr * (mean_y(uploads) - x) + h_sum / a.num_clients,
            {"s": a.options.rho * normalized(mu), "h_sum": h_sum})


def fedvssam(a, x, s, uploads, r):
    g = torch.stack([(x - u.model) / (r.lr * k) for u, k in zip(uploads, r.num_steps)]).mean(0)
    h = (1 - a.options.gamma_g) * s.h + a.options.gamma_g * g
    return x - a.server_lr * h, {"h": h}


def fedacg(a, x, s, uploads, r):
    start = x + a.options.lam * s.m
    m = a.options.lam * s.m + a.server_lr * (mean_y(uploads) - start)
    return x + m, {"m": m}


def scaffold(a, x, s, uploads, r):  # c += (1/N) sum_S (c_i+ - c_i)
    return fedavg_step(a, x, uploads), {"c": s.c + sum(u.dc for u in uploads) / a.num_clients}


# name -> (algorithm, x^t, server state, uploads, server round) -> (x^{t+1}, new server state by field name)
RULES = {
    **{name: lambda a, x, s, uploads, r: (fedavg_step(a, x, uploads), {})
       for name in ("fedavg", "fedprox", "fedsam", "fedasam", "dynsam")},
    "scaffold": scaffold, "fedgamma": scaffold,
    "fedlesam": lambda a, x, s, uploads, r: (fedavg_step(a, x, uploads), {"x_prev": x}),
    "mofedsam": lambda a, x, s, uploads, r: (fedavg_step(a, x, uploads), {"m": -torch.stack(
        [(u.model - x) / (k * r.lr) for u, k in zip(uploads, r.num_steps)]).mean(0)}),
    "fednsam": lambda a, x, s, uploads, r: (x + a.server_lr * (a.options.lam * s.m + mean_y(uploads) - x),
                                            {"m": a.options.lam * s.m + mean_y(uploads) - x}),
    "fednsam-code": nsam_code, "fedsmoo": fedsmoo, "fedvssam": fedvssam, "fedacg": fedacg,
}


@pytest.mark.parametrize("round_", [0, 3])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_aggregate_reduces_to_its_rule_on_hand_made_uploads(case, round_):
    name, options = case
    assert name in RULES, f"{name}: state its server rule here (docs/algorithms.md)"
    recipe = tiny_recipe(algorithm__name=name, train__server_lr=0.7,
                         **{f"algorithm__{k}": v for k, v in options.items()})
    algorithm = build_algorithm(recipe, None)
    generator = torch.Generator().manual_seed(0)

    def random(cls, count=1):
        return [cls.from_named({field: torch.randn(DIM, dtype=torch.float64, generator=generator)
                                for field in cls.names()}) for _ in range(count)]

    x = torch.randn(DIM, dtype=torch.float64, generator=generator)
    (state,) = random(algorithm.ServerState)
    uploads = random(algorithm.Upload, 3)
    server_round = ServerRound(round_, 0.05, (2, 3, 5))
    x_new, new_state = algorithm.aggregate(x, state, uploads, server_round)
    expected_x, expected_state = RULES[name](algorithm, x, state, uploads, server_round)
    assert type(new_state) is algorithm.ServerState
    torch.testing.assert_close(x_new, expected_x, rtol=1e-12, atol=1e-12)
    assert new_state.named().keys() == expected_state.keys()
    for key, value in expected_state.items():
        torch.testing.assert_close(new_state.named()[key], value, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------
# the uplink


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_uplink_float_count_is_the_floats_of_the_upload(tmp_path, case):
    name, options = case
    trainer = linear_trainer(tmp_path, name, options)
    _, results, row = trainer.run_round(trainer.initial_state())
    multiple = re.fullmatch(r"\$(\d*)d\$", documented()[name]["uplink (floats)"])[1] or "1"
    for result in results:
        assert type(result.upload) is trainer.algorithm.Upload
        assert result.uplink_floats == sum(t.numel() for t in result.upload.named().values())
        assert result.uplink_floats == int(multiple) * DIM  # as docs/algorithms.md counts it
        assert result.state is None or type(result.state) is trainer.algorithm.ClientState
    assert row["uplink_floats"] == int(multiple) * DIM


# ----------------------------------------------------------------------------------------------------------
# checkpoints written before state was typed


@pytest.mark.parametrize("name", ["dynsam", "fedsmoo"])
def test_an_earlier_checkpoint_loads_by_field_name_and_continues(tmp_path, name):
    path = EARLIER / f"{name}-round-0002.pt"
    earlier = load_checkpoint(path)
    (tmp_path / "recipe.toml").write_text(earlier["recipe"])
    trainer = loop.Trainer(recipes.read_recipe(tmp_path / "recipe.toml"), RunDir(tmp_path / "run"))
    state = trainer.state_from_checkpoint(earlier, path)
    assert type(state.server_state) is trainer.algorithm.ServerState
    assert all(type(s) is trainer.algorithm.ClientState for s in state.client_states.values())
    # Saved again, its state tables are the earlier ones, name for name and bit for bit.
    payload = trainer.checkpoint_payload(state)
    assert_same_state(payload, earlier)
    # Two rounds from it are the two rounds from its new checkpoint.
    saved = tmp_path / "round-0002.pt"
    torch.save(payload, saved)
    a, b = state, trainer.state_from_checkpoint(load_checkpoint(saved), saved)
    for _ in range(2):
        a, _, _ = trainer.run_round(a)
        b, _, _ = trainer.run_round(b)
    assert_same_state(trainer.checkpoint_payload(a), trainer.checkpoint_payload(b))
    assert a.round == 4 and bool(torch.isfinite(a.x).all())
