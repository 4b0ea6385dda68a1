"""What an analysis pass sees: one checkpoint of one run, its model as a flat vector, and its data.

The sources it reads (a run, a loose folder of checkpoints, plain state_dicts) and how they are found
from a path are in ``source`` and ``state_dict_source``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import Source, file_digest
from landscape.analyze.state_dict_source import StateDictSource
from landscape.config.setup import resolve_device, torch_dtype
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.core.memory_format import MemoryFormatChoice, choose_memory_format
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.gradient_cache import GradientCache
from landscape.measure.incompatibility import AppliedPerturbation, algorithm_perturbation
from landscape.measure.objective import Objective, Problem, evaluation_mode
from landscape.store.checkpoints import Checkpoint, load_client_models, non_finite_weights

_UNREAD = object()  # the clients file not read yet (``CheckpointContext._recorded_start``)

@dataclass
class CheckpointContext:
    """One checkpoint, ready for the passes: model as a flat vector w, global and per-client objectives."""

    source: Source
    round: int
    settings: AnalysisSettings
    flat: FlatModel = field(init=False)
    w: Tensor = field(init=False)
    buffers: dict[str, Tensor] = field(init=False)
    # progress(done, total or None) of the work inside a pass (products, surface cells); set by the scheduler
    progress: Callable[[int, int | None], None] | None = field(init=False, default=None)
    # the name of the result the running pass computes (its plan's ``Job.result_name``); set by the scheduler
    result_name: str | None = field(init=False, default=None)
    # client -> F_i, each built once (``client_objective``)
    _client_objectives: dict[int, Objective] = field(init=False, default_factory=dict, repr=False)
    # the layout of the evaluations, settled by the first use of ``objective`` (None before: nothing evaluated)
    memory_format: MemoryFormatChoice | None = field(init=False, default=None)
    # s^t as recorded beside the kept clients' models (``kept_clients``): None when the file holds none
    _recorded_start: Tensor | None | object = field(init=False, default=_UNREAD, repr=False)
    # the files besides the checkpoint that the running pass reads (kept client models, other checkpoints), in
    # the order read: its result records their SHA-256 and is current only while they are unchanged (the
    # scheduler empties it before each pass)
    files_read: dict[Path, None] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        path = self.source.checkpoints[self.round]
        ckpt = self.source.load(self.round)
        self.device = resolve_device(self.settings.device)
        auto = self.settings.dtype == "auto"
        self.dtype = self.source.dtype_of(ckpt) if auto else torch_dtype(self.settings.dtype)
        module = self.source.build_module().to(self.device, self.dtype)
        # in the BN mode's training flag once: every evaluation's mode switch then switches nothing (issue 47)
        module.train(evaluation_mode(self.settings.bn_mode))
        self.flat = FlatModel(module)
        self.reference_state = module.state_dict()
        ckpt.check_model(self.reference_state, self.source.model_name, self.source.run_dtype)
        self.source.check_recipe(ckpt)  # another run's checkpoint is named as such first
        if not isinstance(self.source, StateDictSource):  # a run's (or a loose folder's) round-NNNN.pt
            ckpt.check_round(self.round)
        # Evaluation and analysis use x_swa once server SWA has produced it.
        self.w, self.buffers = self.flat.from_state_dict(ckpt.analysed_state)
        # x^t of training (differs from w only under server SWA): flatness distance is measured to it.
        self.global_w = self.flat.from_state_dict(ckpt.model_state)[0] if ckpt.has_swa else self.w
        # The one check of the analysed weights, for every pass: finite in the analysis dtype (a checkpoint's
        # tensors were checked at load; a state_dict's weights, and a dtype's range, are checked here).
        for weights, state in ((self.w, ckpt.analysed_state), (self.global_w, ckpt.model_state)):
            error = None if bool(torch.isfinite(weights).all()) else non_finite_weights(
                path, {n: state[n] for n in self.flat.names}, self.dtype)
            if error is not None:
                raise error
        self.digest = file_digest(path)

    def load_global(self, path: Path, analysed: bool = True) -> Tensor:
        """The flat model vector of another checkpoint of this run (x_swa when ``analysed`` and it exists,
        else x^t), checked against the model."""
        self.files_read[Path(path)] = None
        ckpt = Checkpoint.load(path)
        ckpt.check_model(self.reference_state, self.source.model_name)
        return self.flat.from_state_dict(ckpt.analysed_state if analysed else ckpt.model_state)[0]

    # -- data -------------------------------------------------------------------------------------------
    @cached_property
    def global_data(self) -> AnalysisData:
        x, y = self.source.analysis_set(self.settings.split)
        n = self.settings.analysis_samples
        if 0 < n < len(y):
            pick = np.sort(np.random.default_rng(self.settings.seed).choice(len(y), size=n, replace=False))
            x, y = x[torch.as_tensor(pick)], y[torch.as_tensor(pick)]
        return AnalysisData(x, y, self.settings.batch_size).place(self.device, self.dtype)

    @cached_property
    def objective(self) -> Objective:
        """F over the analysis data; its first use settles the layout of every evaluation (``memory_format``)."""
        objective = Objective(self.flat, self.buffers, self.global_data, self.settings.bn_mode)
        self.memory_format = self._settle_memory_format(objective)
        return objective

    def _settle_memory_format(self, objective: Objective) -> MemoryFormatChoice:
        """``analyze.memory_format``'s layout of this checkpoint's losses and gradients (F and every F_i), set on
        the model: the setting's, "auto" resolved by ``choose_memory_format``'s rule from the model and the
        device alone (so every rank under torchrun, and every rerun, computes alike). Hessian-vector products
        are contiguous in every case (``HessianOperator``)."""
        choice = choose_memory_format(self.settings.memory_format, self.flat, self.device,
                                      name="analyze.memory_format")
        self.flat.channels_last = choice.channels_last
        return choice

    @cached_property
    def problem(self):
        """F at the checkpoint's w, as the function API takes it."""
        return Problem(self.objective, self.w)

    @property
    def num_clients(self) -> int:
        """The run's clients (0 for a plain state_dict)."""
        return 0 if isinstance(self.source, StateDictSource) else len(self.source.setup.client_indices)

    def client_data(self, client: int) -> AnalysisData:
        bundle = self.source.setup.bundle
        index = torch.as_tensor(self.source.setup.client_indices[client])
        return AnalysisData(bundle.train.x[index], bundle.train.y[index], self.settings.batch_size).place(
            self.device, self.dtype
        )

    def client_objective(self, client: int) -> Objective:
        """F_i over client i's (never augmented) training data: built once per checkpoint (its data placed and
        checked against the model once), so that every pass asks ``gradients`` about the same objective."""
        if client not in self._client_objectives:
            _ = self.objective  # the layout is settled first, by the global objective
            self._client_objectives[client] = Objective(self.flat, self.buffers, self.client_data(client),
                                                        self.settings.bn_mode)
        return self._client_objectives[client]

    @cached_property
    def gradients(self) -> GradientCache:
        """What several passes of this checkpoint compute at w, computed once (``gradient_cache``): grad F,
        every grad F_i, the clients' minibatch gradients and the sharpness ascents."""
        return GradientCache(self.w)

    def sample_clients(self, count: int) -> list[int]:
        """All clients (count 0 or >= N) or a seeded sample of ``count``."""
        n = self.num_clients
        if count <= 0 or count >= n:
            return list(range(n))
        return sorted(int(i) for i in np.random.default_rng(self.settings.seed).choice(n, count, replace=False))

    # -- kept client models -----------------------------------------------------------------------------
    def kept_clients(self) -> dict[int, Tensor]:
        """This round's clients' final local models y_{i,K} (saved with --keep-clients)."""
        path = self.source.clients_checkpoint(self.round)
        if not path.is_file():
            raise LandscapeError(
                f"{self.source.name} has no client models for round {self.round}; "
                "train with --keep-clients to save them at checkpoints"
            )
        self.files_read[path] = None
        kept, start = load_client_models(path, self.reference_state, self.source.model_name, self.source.run_dtype,
                                         self.num_clients)
        # s^t, recorded beside them (run format 2): kept, so that broadcast_start reads the file no second time
        self._recorded_start = None if start is None else self.flat.from_state_dict(start)[0]
        return {i: self.flat.from_state_dict(state)[0] for i, state in kept.items()}

    def previous_global(self) -> Tensor | None:
        """x^{t-1}, the global model of training before this round (checkpoint ``round-(t-1)``; never x_swa),
        when that round was checkpointed. The clients started from it only where the algorithm broadcasts it
        unchanged: ``broadcast_start`` gives the point they did start from."""
        path = self.source.checkpoints.get(self.round - 1)
        if path is None:
            return None
        return self.load_global(path, analysed=False)

    def broadcast_start(self) -> Tensor | None:
        """s^t, the model this round's clients started their local steps from: recorded beside their models
        (``start`` in ``round-NNNN.clients.pt``, run format 2: written by the trainer and ``RunWriter``), so no
        algorithm is needed to find it. A run written before the format recorded it has it rebuilt when round
        t-1 was checkpointed (``rebuilt_start``); else None."""
        if self._recorded_start is _UNREAD and self.source.clients_checkpoint(self.round).is_file():
            self.kept_clients()  # reads the start beside the clients' models
        if isinstance(self._recorded_start, Tensor):
            self.files_read[self.source.clients_checkpoint(self.round)] = None  # read by an earlier pass, maybe
            return self._recorded_start.to(self.device, self.dtype)
        return self.rebuilt_start()

    def rebuilt_start(self) -> Tensor | None:
        """s^t of a run written before the run format recorded it, when round t-1 was checkpointed:
        s^t = A.start_point(A.broadcast(x^{t-1}, server_state^{t-1}, t-1)), with A the run's algorithm rebuilt
        from its recipe (``build_algorithm``, as the trainer builds it) and x^{t-1} and its server state from
        checkpoint ``round-(t-1)``. It is x^{t-1} for FedAvg and every rule that sends the global model, the
        look-ahead x^{t-1} + lam m^{t-2} for fedacg and fednsam-code. Computed on the CPU in the checkpoint's
        dtype (the training arithmetic), then placed like ``w``."""
        path = self.source.checkpoints.get(self.round - 1)
        if path is None:
            return None
        if self.source.recipe is None:
            raise LandscapeError(f"{self.source.name} is a plain state_dict: it has no algorithm to start clients")
        # The algorithm rules (never the training loop): what the server sent is defined by them alone.
        from landscape.train.algorithms import ParamLayout, build_algorithm

        self.files_read[path] = None
        ckpt = Checkpoint.load(path)
        ckpt.check_model(self.reference_state, self.source.model_name)
        state = ckpt.model_state
        x = torch.cat([state[n].reshape(-1) for n in self.flat.names])
        server_state = ckpt.payload.get("server_state")
        if not isinstance(server_state, dict):
            raise LandscapeError(f"{path} holds no server state: the clients' start point of round {self.round} "
                                 "cannot be rebuilt")
        algorithm = build_algorithm(self.source.recipe, ParamLayout(tuple(self.flat.names),
                                                                    tuple(map(tuple, self.flat.shapes))))
        try:
            typed = algorithm.ServerState.from_named(server_state)  # the state by its field names
            start = algorithm.start_point(algorithm.broadcast(x, typed, self.round - 1))
        except ValueError as unknown:
            raise LandscapeError(f"{path} holds a server state {self.source.recipe.algorithm.name} does not keep "
                                 f"({unknown}): the clients' start point of round {self.round} cannot be rebuilt"
                                 ) from None
        except KeyError as missing:
            raise LandscapeError(f"{path} lacks the server state {missing} that {self.source.recipe.algorithm.name} "
                                 f"broadcasts: the clients' start point of round {self.round} cannot be rebuilt"
                                 ) from None
        return start.to(self.device, self.dtype)

    def applied_perturbation(self) -> AppliedPerturbation:
        """The perturbation the run's algorithm A applies at the start of round t from this checkpoint (the
        incompatibility pass's applied figures): A's ``perturbation_direction`` with its broadcast of x^t and
        the server state, and each client's state, as the checkpoint holds them (``algorithm_perturbation``;
        A rebuilt from the recipe, ``build_algorithm``)."""
        from landscape.train.algorithms import ParamLayout, build_algorithm

        name = self.source.recipe.algorithm.name
        payload = self.source.load(self.round).payload
        server_state, client_states = payload.get("server_state"), payload.get("client_states")
        if not isinstance(server_state, dict) or not isinstance(client_states, dict):
            return AppliedPerturbation(name, None, f"round {self.round}'s checkpoint holds no server and client "
                                                   "states to apply the algorithm's perturbation from")
        try:
            algorithm = build_algorithm(self.source.recipe, ParamLayout(tuple(self.flat.names),
                                                                        tuple(map(tuple, self.flat.shapes))))
        except LandscapeError as unknown:  # a recorded run's own rule, not registered here
            return AppliedPerturbation(name, None, str(unknown))
        return algorithm_perturbation(algorithm, self.global_w, server_state, client_states, self.round)


def registered_algorithm(name: str, options: dict, flat: FlatModel, num_clients: int) -> object:
    """The registered algorithm ``name`` with ``options`` (its recipe's [algorithm] keys), for its rules alone
    (the notebook API's applied perturbation; server_lr 1)."""
    from landscape.train.algorithms import ALGORITHMS, ParamLayout

    entry = ALGORITHMS.get(name)
    values = entry.make_options(dict(options), "algorithm")
    return entry.factory(values, num_clients=num_clients, server_lr=1.0,
                         layout=ParamLayout(tuple(flat.names), tuple(map(tuple, flat.shapes))))
