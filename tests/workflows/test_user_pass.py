"""A pass declared by a module the run's recipe imports: ``landscape analyze RUN --passes <it> --trust-imports``
runs it (the recipes are read, and their modules imported, before the pass names are checked); without
--trust-imports the refusal is one line that names the modules and the flag."""

from __future__ import annotations

import json
import sys

import torch
from support.helpers import invoke, one_line_error, tiny_recipe, write_user_module

PASS_MODULE = '''
from landscape.analyze.registry import PASSES, PassOutput

PASSES.declare("square-norm", summary="||x||^2 of the trainable parameters")


@PASSES.implement("square-norm")
def square_norm(ctx, options):
    return PassOutput({"square_norm": float((ctx.w.double() ** 2).sum())})
'''


def _forget(name: str) -> None:
    from landscape.analyze.passes import PASSES

    PASSES._entries.pop("square-norm", None)
    sys.modules.pop(name, None)


def test_a_pass_of_the_runs_imports_runs_with_trust_imports_and_is_named_without(tmp_path, monkeypatch):
    from landscape.train import loop

    name = write_user_module(tmp_path, monkeypatch, "passlab", PASS_MODULE)
    try:
        loop.start_run(tiny_recipe(imports=[name], train__rounds=1), tmp_path / "run", progress=False)
        _forget(name)  # as a fresh process that reads the run: the module is not imported

        line = one_line_error(invoke("analyze", tmp_path / "run", "--passes", "square-norm", "--quiet"))
        assert "unknown analysis pass 'square-norm'" in line and name in line and "--trust-imports" in line, line
        assert name not in sys.modules

        done = invoke("analyze", tmp_path / "run", "--passes", "square-norm", "--quiet", "--trust-imports")
        assert done.exit_code == 0, done.output
        (result,) = (tmp_path / "run" / "analysis" / "round-0001").glob("square-norm*.json")
        model = torch.load(tmp_path / "run" / "checkpoints" / "round-0001.pt", weights_only=True)["model"]
        expected = sum(float((v.double() ** 2).sum()) for v in model.values() if v.is_floating_point())
        assert abs(json.loads(result.read_text())["result"]["square_norm"] - expected) <= 1e-9 * expected
    finally:
        _forget(name)
