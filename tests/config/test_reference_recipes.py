"""Recipes that mirror a reference code name it in one comment line of a fixed form,
``# reference: owner/repo path/to/file``, and hold that code's values (read with the package's recipe loader):
FedNSAM's main_FedNSAM.py runs FedNSAM and FedSAM at rho 0.05 and clips at norm 10; FL-Simulator's client clips
at norm 10; the fedsam commands collect an SWA model every 10 rounds at SWA lr 1e-4 (--swa-c 10, --swa-lr's
default). The paper recipes draw their partition as the reference codes do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from landscape.config import overrides as recipe_overrides

TRAIN = Path(__file__).resolve().parents[2] / "train"
REFERENCE_LINE = re.compile(r"^# reference: ([\w.-]+/[\w.-]+) (\S+)$")
# the recipes that mirror a reference code, and the file each names
MIRRORS = {
    "cifar100-fednsam.toml": "junkangLiu0/FedNSAM main_FedNSAM.py",
    "cifar10-resnet18-gn.toml": "woodenchild95/FL-Simulator client/client.py",
    "cifar10-lenet5-fedsam.toml": "debcaldarola/fedsam paper_experiments/cifar10.sh",
}


def references(path: Path) -> list[str]:
    """The reference lines of a recipe; a comment that mentions a reference in another form fails here."""
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("#") and re.search(r"\breference:", line):
            match = REFERENCE_LINE.match(line)
            assert match, f"{path.name}: {line!r} is not '# reference: owner/repo path'"
            found.append(f"{match[1]} {match[2]}")
    return found


@pytest.mark.parametrize("path", sorted(TRAIN.glob("*.toml")), ids=lambda p: p.name)
def test_a_recipe_names_the_reference_it_mirrors_in_the_fixed_form(path):
    names = references(path)
    assert names == ([MIRRORS[path.name]] if path.name in MIRRORS else []), path.name


def runs(name: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for recipe, _ in recipe_overrides.build_sweep(TRAIN / name):
        out.setdefault(recipe.algorithm.name, []).append(recipe)
    return out


def test_cifar100_fednsam_runs_the_authors_rho_and_clipping():
    by_algorithm = runs("cifar100-fednsam.toml")
    assert set(by_algorithm) == {"fedsam", "fednsam", "fednsam-code"}
    for recipes in by_algorithm.values():
        for r in recipes:
            assert r.algorithm.options["rho"] == 0.05 and r.train.clip_norm == 10.0
            assert r.train.weight_decay == 0.001


def test_the_fl_simulator_setting_clips_at_ten():
    for recipes in runs("cifar10-resnet18-gn.toml").values():
        assert all(r.train.clip_norm == 10.0 for r in recipes)


def test_the_fedsam_setting_uses_its_swa_cycle_and_lr():
    recipes = [r for rs in runs("cifar10-lenet5-fedsam.toml").values() for r in rs]
    assert {r.train.swa for r in recipes} == {False, True}
    for r in recipes:
        assert (r.train.swa_cycle, r.train.swa_lr, r.train.swa_start) == (10, 1e-4, 0.75)
        assert r.train.lr == 0.01  # the clients' lr stays the commands' -lr 0.01


@pytest.mark.parametrize("path", sorted(TRAIN.glob("cifar*.toml")), ids=lambda p: p.name)
def test_paper_recipes_draw_the_partition_as_the_reference_codes_do(path):
    for recipe, _ in recipe_overrides.build_sweep(path):
        assert recipe.partition.name == "dirichlet-client-reuse"
