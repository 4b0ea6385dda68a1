"""torch.distributed: 2 gloo ranks on CPU (torchrun) give the single-process numbers; the helpers in one
process; mixed precision and torch.compile in the training loop; streamed analysis data.

The distributed runs are two torchrun launches shared by the tests (module fixtures): a training sweep
(SCAFFOLD, FedSAM, dynamic-radius SAM) through `torchrun -m landscape train`, then tests/parallel_worker.py: the
SCAFFOLD run resumed to one more round through the command line's entry, then collectives, HVP, a resumed surface
grid, run_analysis over checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from parallel_worker import ANALYSIS, CELLS_PER_BATCH, GRID, HESSIAN, SURFACE, problem
from support.helpers import result_file, tiny_recipe

from landscape.analyze.catalog import pass_options
from landscape.analyze.plan import Job, split_work
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.measure.surface.evaluation import evaluate_surface
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop

ALGORITHMS = ["scaffold", "fedsam", "dynsam"]  # client state (c_i; int and vector statistics), SAM steps
TRAIN = {"partition__clients": 5, "train__participation": 0.6, "train__keep_clients": True, "train__rounds": 2}
TRAIN_FLAGS = ["--clients", "5", "--participation", "0.6", "--keep-clients", "--rounds", "2", "--local-steps", "2",
               "--batch-size", "16", "--checkpoint-every", "1", "--device", "cpu", "--set", "partition.alpha=0.5"]


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """2 ranks on this machine (--standalone: a free port), gloo on CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def one_thread():
    """The in-process references on one thread, as each torchrun rank computes (and fast on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_name(algorithm: str) -> str:
    recipe = tiny_recipe(algorithm__name=algorithm, **TRAIN)
    return recipe_overrides.sweep_run_name(recipe, {"algorithm.name": algorithm})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """The sweep trained by 2 ranks (2 rounds; SCAFFOLD is resumed to a 3rd by the ``worker`` launch) and by one
    process (SCAFFOLD for 3 rounds)."""
    root = tmp_path_factory.mktemp("parallel")
    done = torchrun("-m", "landscape", "train", "--algorithm", ",".join(ALGORITHMS), *TRAIN_FLAGS,
                    "--out", str(root / "ranks"), "--quiet", cwd=root)
    for algorithm in ALGORITHMS:
        rounds = 3 if algorithm == "scaffold" else 2
        recipe = tiny_recipe(algorithm__name=algorithm, **{**TRAIN, "train__rounds": rounds})
        loop.start_run(recipe, root / "single" / run_name(algorithm), progress=False)
    return root, done.stdout


@pytest.mark.slow  # torchrun processes
def test_distributed_training_equals_single_process(trained, worker):  # worker: SCAFFOLD resumed to round 3
    root, stdout = trained
    assert stdout.count("test accuracy") == len(ALGORITHMS)  # rank 0 alone reports (and writes)
    for algorithm in ALGORITHMS:
        ranks, single = RunDir(root / "ranks" / run_name(algorithm)), RunDir(root / "single" / run_name(algorithm))
        assert ranks.recipe.read_text() == single.recipe.read_text()
        assert sorted(p.name for p in ranks.checkpoints.iterdir()) == sorted(p.name for p in single.checkpoints.iterdir())
        rows, expected = ranks.read_metrics(), single.read_metrics()
        assert len(rows) == len(expected)  # no row written twice
        for row, want in zip(rows, expected):
            assert row.keys() == want.keys() and row["clients"] == want["clients"]
            for key in want.keys() - {"seconds", "round", "clients"}:
                assert row[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (algorithm, key)
        for path in single.checkpoints.iterdir():
            a, b = load_checkpoint(ranks.checkpoints / path.name), load_checkpoint(path)
            for part in ("model", "server_state", "clients"):
                torch.testing.assert_close(a.get(part), b.get(part), rtol=1e-5, atol=1e-6)
            # every client's persistent state (c_i, dynsam's counters and gradients) and nothing else
            torch.testing.assert_close(a.get("client_states"), b.get("client_states"), rtol=1e-5, atol=1e-6)
    state = load_checkpoint(root / "ranks" / run_name("dynsam") / "checkpoints" / "round-0002.pt")["client_states"]
    assert {s["count"].dtype for s in state.values()} == {torch.int64}


@pytest.mark.slow  # torchrun processes
def test_resumed_distributed_run_continues_as_one_uninterrupted_process(worker):
    root, _ = worker
    ranks = RunDir(root / "ranks" / run_name("scaffold"))
    assert ranks.rounds() == [0, 1, 2, 3] and [r["round"] for r in ranks.read_metrics()] == [1, 2, 3]
    # test_distributed_training_equals_single_process compares its files with the 3-round single process


@pytest.fixture(scope="module")
def worker(trained, one_thread):
    """tests/parallel_worker.py on 2 ranks: it resumes the 2-rank SCAFFOLD run to round 3, copies it, and its
    run_analysis works on one copy (the other is this process's, to analyse alone)."""
    root, _ = trained
    out = root / "worker"
    out.mkdir()
    torchrun(str(Path(__file__).resolve().parents[1] / "parallel_worker.py"), str(out), str(root / "analysed-ranks"),
             str(root / "ranks" / run_name("scaffold")), "3", str(root / "analysed-ranks"),
             str(root / "analysed-single"), cwd=root)
    return root, out


@pytest.mark.slow  # torchrun processes
def test_distributed_hvp_equals_the_single_process_hvp(worker):
    _, out = worker
    p = problem()
    products = torch.load(out / "hvp.pt", weights_only=True)
    for backend, product in products.items():
        expected = HessianOperator(p["objective"], p["w"], backend).matmat(p["vectors"])
        # 5 batches: 3 on rank 0, 2 on rank 1, each weighted n_b / n as in one process
        torch.testing.assert_close(product, expected, rtol=1e-12, atol=1e-14)
    objective, data = p["objective"], p["objective"].data

    def mean_loss(w: torch.Tensor) -> torch.Tensor:  # F: the mean over all 300 samples, written out here
        return sum(len(yb) * objective.batch_loss(w, (xb, yb)) for xb, yb in data.batches()) / len(data)

    dense = torch.autograd.functional.hessian(mean_loss, p["w"], vectorize=True)  # 1,210 x 1,210
    torch.testing.assert_close(products["double-backward"], dense @ p["vectors"], rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # torchrun processes
def test_distributed_surface_equals_the_single_process_surface(worker):
    _, out = worker
    p = problem()
    saved = np.load(out / "surface.npz")
    expected = evaluate_surface(p["objective"], p["w"], p["d1"], p["d2"], *GRID, loss=p["partial_loss"],
                                accuracy=p["partial_accuracy"], cells_per_batch=CELLS_PER_BATCH)
    # The same chunks of cells, so bit for bit; the two resumed rows kept as given.
    np.testing.assert_array_equal(saved["loss"], expected.loss)
    np.testing.assert_array_equal(saved["accuracy"], expected.accuracy)
    assert np.all(saved["loss"][:2] == 0.5) and not np.isnan(saved["loss"]).any()
    assert int(saved["evaluated"]) == expected.cells_evaluated == 7 * 7
    assert len(saved["saves"]) > 0 and np.all(np.diff(saved["saves"]) > 0)  # partial grids, growing, rank 0


@pytest.mark.slow  # torchrun processes
def test_distributed_analysis_over_checkpoints_equals_single_process(worker):
    root, _ = worker
    options = {"loss": pass_options("loss", {}), "hessian": pass_options("hessian", HESSIAN),
               "surface": pass_options("surface", SURFACE)}
    settings = AnalysisSettings(device="cpu", analysis_samples=ANALYSIS["samples"])
    report = run_analysis(root / "analysed-single", rounds=ANALYSIS["rounds"], passes=ANALYSIS["passes"],
                          settings=settings, options=options, progress=False)
    assert report.computed == 9
    for folder in sorted((root / "analysed-single" / "analysis").iterdir()):
        other = root / "analysed-ranks" / "analysis" / folder.name
        assert sorted(p.name for p in other.iterdir()) == sorted(p.name for p in folder.iterdir())
        for name in ANALYSIS["passes"]:
            a, b = (json.loads(result_file(f, name).read_text()) for f in (other, folder))
            assert a["settings"] == b["settings"] and a["checkpoint_sha256"] == b["checkpoint_sha256"]
            # Round 3 ran on both ranks together (HVPs split), rounds 0 and 1 on one rank each.
            for key, value in b["summary"].items():
                assert a["summary"][key] == pytest.approx(value, rel=1e-4), (folder.name, name, key)
        ours, theirs = (np.load(result_file(f, "surface").with_suffix(".npz")) for f in (other, folder))
        np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# in one process


def test_helpers_in_a_single_process_do_nothing():
    assert not parallel.is_distributed() and parallel.world_size() == 1 and parallel.rank() == 0
    assert parallel.is_main()
    t = torch.tensor([1.5, 2.0])
    assert parallel.all_reduce_sum(t) is t and t.tolist() == [1.5, 2.0]
    assert parallel.all_gather_objects({"a": 1}) == [{"a": 1}] and parallel.broadcast_object(7) == 7
    (received,) = parallel.all_gather_tensors([t, torch.tensor(3)], "cpu")
    assert torch.equal(received[0], t) and received[1].item() == 3
    assert parallel.shard(["a", "b", "c"]) == ["a", "b", "c"] and parallel.on_main(lambda: 4) == 4
    with pytest.raises(LandscapeError, match="nope"):
        parallel.on_main(lambda: (_ for _ in ()).throw(LandscapeError("nope")))


@pytest.mark.parametrize("count, ranks", [(0, 2), (1, 3), (5, 2), (7, 3), (12, 4)])
def test_shards_are_contiguous_balanced_blocks_in_order(count, ranks):
    blocks = [range(*parallel.shard_bounds(count, ranks, r)) for r in range(ranks)]
    assert [i for block in blocks for i in block] == list(range(count))
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_analysis_work_splits_whole_checkpoints_and_runs_the_rest_together():
    source_a, source_b = object(), object()
    jobs = [Job(source, r, name, None, {}, name) for source in (source_a, source_b) for r in (0, 1, 2)
            for name in ("loss", "surface", "hessian")]
    todo = [i for i in range(len(jobs)) if i != 0]  # the first loss result already exists
    queues, together = split_work(jobs, todo, 4)
    # 6 checkpoints on 4 ranks: 4 checkpoints alone (one per rank), the last 2 and every surface together
    assert queues == [[2], [3, 5], [6, 8], [9, 11]]
    assert together == [1, 4, 7, 10, 12, 13, 14, 15, 16, 17]
    assert sorted([i for queue in queues for i in queue] + together) == todo
    assert split_work(jobs, todo, 1) == ([todo], [])  # one process: the plan's order


def test_main_joins_no_process_group_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with parallel.session():
        assert not parallel.launched() and not parallel.is_distributed()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(LandscapeError, match="start several ranks with torchrun"):
        parallel.init()


# ----------------------------------------------------------------------------------------------------------
# the GPU path, as far as a CPU shows it


@pytest.mark.parametrize("changes, message", [
    ({"train__precision": "fp16"}, "train.precision must be one of float32, bf16"),
    ({"train__precision": "bf16", "train__dtype": "float64"}, "cannot be combined with train.dtype"),
    ({"train__compile": "yes"}, "train.compile must be true or false"),
])
def test_precision_and_compile_are_validated(changes, message):
    with pytest.raises(LandscapeError, match=message):
        tiny_recipe(**changes)


def test_bf16_autocasts_the_local_steps_only(tmp_path):
    runs = {}
    for precision in ("float32", "bf16"):
        trainer = loop.Trainer(tiny_recipe(train__precision=precision), RunDir(tmp_path / precision))
        state, results, row = trainer.run_round(trainer.initial_state())
        runs[precision] = (trainer, state, results, row)
    trainer, state, results, row = runs["bf16"]
    assert state.x.dtype == torch.float32 and all(r.model.dtype == torch.float32 for r in results)
    reference = runs["float32"][1].x
    difference = float((state.x - reference).norm() / (reference - trainer.initial_state().x).norm())
    assert 1e-4 < difference < 0.1  # bfloat16 rounding in the local steps: visible, small
    # The local oracle runs in bfloat16 (its logits), evaluation does not.
    problem = trainer.local_problem(0, 0, 0.1, {})
    batch = next(problem.batches())
    with trainer.mixed_precision():
        assert trainer.flat.logits(state.x, batch[0], {}).dtype == torch.bfloat16
    assert trainer.flat.logits(state.x, batch[0], {}).dtype == torch.float32
    torch.testing.assert_close(torch.tensor(trainer.evaluate(state)),
                               torch.tensor(runs["float32"][0].flat.evaluate(state.x, {}, trainer.test_x,
                                                                             trainer.test_y)))
    assert row["train_loss"] == pytest.approx(runs["float32"][3]["train_loss"], rel=0.02)


def test_compile_wraps_the_training_forward_only(tmp_path, monkeypatch):
    compiled = []

    def fake_compile(fn, **kwargs):  # torch.compile's contract: a callable computing the same function
        def wrapped(*args):
            compiled.append(fn)
            return fn(*args)

        return wrapped

    monkeypatch.setattr(torch, "compile", fake_compile)
    plain = loop.Trainer(tiny_recipe(), RunDir(tmp_path / "plain"))
    trainer = loop.Trainer(tiny_recipe(train__compile=True), RunDir(tmp_path / "compiled"))
    assert not compiled
    state = trainer.run_round(trainer.initial_state())[0]
    assert compiled and all(fn == trainer.flat._call_module for fn in compiled)
    torch.testing.assert_close(state.x, plain.run_round(plain.initial_state())[0].x, rtol=0, atol=0)
    assert recipes.difference(recipes.to_toml(tiny_recipe(train__compile=True)), tiny_recipe(),
                              recipes.RESUME_FREE_KEYS) is None


def test_streamed_analysis_data_gives_the_resident_numbers():
    p = problem()
    data = p["objective"].data
    streamed = data.stream_to("cpu", torch.float64)
    assert streamed.streamed and not data.streamed
    assert data.place("cpu", resident_bytes=0).device is None  # the CPU never streams
    objective = Objective(p["flat"], {}, streamed)
    assert objective.loss(p["w"]).item() == p["objective"].loss(p["w"]).item()
    assert objective.accuracy(p["w"]) == p["objective"].accuracy(p["w"])
    torch.testing.assert_close(HessianOperator(objective, p["w"]).matmat(p["vectors"]),
                               HessianOperator(p["objective"], p["w"]).matmat(p["vectors"]), rtol=0, atol=0)
    index = torch.tensor([5, 0, 299])
    for got, want in zip(streamed.take(index), (data.x[index], data.y[index])):
        assert torch.equal(got, want)


def test_analysis_data_batches_cover_the_set_in_fixed_ranges():
    data = AnalysisData(torch.zeros(300, 2), torch.zeros(300, dtype=torch.long), batch_size=64)
    assert data.batch_ranges() == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 300)]
    assert [len(y) for _, y in data.batches()] == [64, 64, 64, 64, 44]
