"""The Hessian of the analysis objective as a linear operator: ``H @ v`` by Hessian-vector products.

``HessianOperator(objective, w)`` is grad^2 F(w) for the objective's data set, applied without ever forming
the matrix (curvlinops / hessian-eigenthings style): ``op @ v``, ``op.matmat(V)``, ``op.dim``,
``op.hvp_count``. One product streams over the objective's fixed batches, holding one batch's graph at a
time, and sums (n_b / n) * H_b v, so batches are weighted by their size exactly as F weights them. Under
torchrun the batches are split across the ranks and the sum is all-reduced (``matmat``).

Two ways to compute H_b v, equal up to rounding:

- ``double-backward``: v . grad f_b differentiated once more (reverse-over-reverse, Pearlmutter's trick) through
  a gradient graph built by ``gradient_graphs`` (convolutions on first-order kernels, no zero terms).
  Kept graphs (the default where they fit, see below): each batch's gradient graph is built once, at the
  first product, and every later product is one more backward pass through it (as PyHessian does for a
  single batch); otherwise each product rebuilds it (a matmat of k columns builds it once per batch and
  back-propagates it k times). Both run the same operations in the same order: the same numbers.
- ``forward-over-reverse``: the directional derivative of the gradient function, ``torch.func.jvp`` of
  ``torch.func.grad`` (usually the cheaper of the two on GPUs); it recomputes the gradient every product.
- ``auto`` (the default): double-backward, through kept graphs where they fit, rebuilt every product
  otherwise: the same numbers either way, so no Hessian number depends on the memory free or on a timing
  (an earlier release timed the two backends where the graphs did not fit; issue 43).

Both differentiate with respect to the parameters by name, products written in place (``products``).

Memory rule for kept graphs (``keep_graph=None``, the default): at the first product the operator builds
the first batch's gradient graph, measures the bytes of the tensors it saves (activations and the
double-backward's own saved tensors, each storage once, the data and w not counted), and keeps the
graphs of all its batches only if that size times its number of batches is at most ``memory_budget``
(default: ``KEEP_GRAPH_FRACTION`` of the memory free on the device at that moment, ``MemAvailable`` of
/proc/meminfo on the CPU). Otherwise, or where the free memory cannot be read, every product recomputes.
``keep_graph=True`` keeps them whatever their size, ``False`` never; ``release()`` frees them.

The model is used through ``torch.func.functional_call`` (``Objective``), so parameters, ``requires_grad``,
training flags and ``.grad`` are never touched. BatchNorm buffers are fixed at w when the operator is built
(for ``recompute``: the statistics recomputed at w are constants of H, not functions of w).

Solvers (``lanczos``, ``trace``, ``density``) trust an operator only if it is a deterministic function of v;
``check_determinism`` probes that (with kept graphs: a product through them against one through freshly
built graphs, so a dropout mask frozen into a kept graph is caught too) and names the usual culprits.

``progress(done, total)``: an optional callback, called after every product with the number of products
this operator has computed so far (``total`` None: an operator does not know how many will follow).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor, nn

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.flat import ParameterLeaves
from landscape.measure import products
from landscape.measure.objective import Objective
from landscape.measure.products import Gradient, free_memory  # free_memory: also imported from here

BACKENDS = ("auto", "double-backward", "forward-over-reverse")

# Relative agreement two evaluations of Hv must reach (check_determinism). Reductions are the only rounding
# differences a deterministic computation has, so far below what a dropout mask or a shuffled batch causes.
DETERMINISM_RTOL = {torch.float64: 1e-10, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}

# Kept gradient graphs may take at most this fraction of the memory free on the device (module docstring).
KEEP_GRAPH_FRACTION = 0.5

# progress(done, total): work done so far and the total where known (None: unknown).
Progress = Callable[[int, "int | None"], None]


class LinearOperator(ABC):
    """A symmetric operator on vectors of length ``dim``: what the spectral solvers need.

    Subclasses define ``dtype``, ``device`` and ``matmat`` and count their products in ``hvp_count``;
    ``@``, ``matvec`` and the determinism probe come from here.
    """

    dim: int
    hvp_count: int

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @abstractmethod
    def matmat(self, vectors: Tensor) -> Tensor:
        """The operator applied to the columns of ``vectors`` [dim, k]; counts k products."""

    def matvec(self, v: Tensor) -> Tensor:
        return self.matmat(self._as_columns(v, vector=True))[:, 0]

    def __matmul__(self, other: Tensor) -> Tensor:
        if other.dim() == 1:
            return self.matvec(other)
        return self.matmat(other)

    def _as_columns(self, vectors: Tensor, *, vector: bool = False) -> Tensor:
        expected = (self.dim,) if vector else (self.dim, "k")
        if vector:
            if vectors.shape != (self.dim,):
                raise LandscapeError(f"expected a vector of shape {expected}, got {tuple(vectors.shape)}")
            vectors = vectors[:, None]
        elif vectors.dim() != 2 or vectors.shape[0] != self.dim:
            raise LandscapeError(f"expected a matrix of shape {expected}, got {tuple(vectors.shape)}")
        return vectors.detach().to(self.device, self.dtype)

    def check_determinism(self, seed: int = 0, rtol: float | None = None) -> float:
        """Evaluate Hv twice for one random v; return the relative difference, or raise if it exceeds rtol.

        Costs two products (counted in ``hvp_count``). ``rtol`` defaults to ``DETERMINISM_RTOL[dtype]``.
        """
        tolerance = DETERMINISM_RTOL.get(self.dtype, 1e-6) if rtol is None else rtol
        generator = torch.Generator().manual_seed(seed)
        v = torch.randn(self.dim, generator=generator, dtype=torch.float64).to(self.device, self.dtype)
        first, second = self._probe_products(v)
        if not (torch.isfinite(first).all() and torch.isfinite(second).all()):
            raise LandscapeError("the Hessian-vector product is not finite (NaN or inf) at this point; check the "
                                 "checkpoint's weights and the analysis data")
        scale = float(torch.linalg.vector_norm(first.double()))
        difference = float(torch.linalg.vector_norm((first - second).double()))
        relative = difference / scale if scale > 0 else difference
        if relative > tolerance:
            raise LandscapeError(
                f"the Hessian-vector product is not deterministic: two evaluations of Hv differ by {relative:.1e} "
                f"(relative; tolerance {tolerance:.0e}); likely causes: dropout layers, BatchNorm in train mode "
                "(--bn-mode train-batch-stats with shuffled data), data augmentation, or nondeterministic kernels"
            )
        return relative

    def _probe_products(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """Two independent evaluations of Hv for the determinism probe."""
        return self.matvec(v), self.matvec(v)


class HessianOperator(LinearOperator):
    """grad^2 F(w) of ``objective`` at ``w`` as a linear operator (see the module docstring).

    ``keep_graph``: None (default) keeps the double-backward's gradient graphs when they fit in
    ``memory_budget`` bytes (default ``KEEP_GRAPH_FRACTION`` of the device's free memory at the first
    product), True always, False never (every product rebuilds them). ``progress(done, None)`` is called
    after every product. After the first product ``keeps_graph`` says what was decided, ``graph_bytes``
    the measured size of the kept graphs (the estimate, where they were not kept) and ``backend_used`` the
    backend the products use.
    """

    def __init__(
        self,
        objective: Objective,
        w: Tensor,
        backend: str = "auto",
        *,
        keep_graph: bool | None = None,
        memory_budget: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise LandscapeError(f"unknown Hessian backend '{backend}'; choose from: {', '.join(BACKENDS)}")
        if w.dim() != 1 or w.numel() != objective.flat.dim:
            raise LandscapeError(
                f"w must be a flat vector of the model's {objective.flat.dim} parameters, got shape {tuple(w.shape)}"
            )
        if keep_graph and backend == "forward-over-reverse":
            raise LandscapeError("keep_graph applies to the double-backward backend (forward-over-reverse "
                                 "recomputes the gradient every product)")
        if memory_budget is not None and memory_budget < 0:
            raise LandscapeError(f"memory_budget must be >= 0 bytes, got {memory_budget}")
        self.objective = objective
        self.w = w.detach()
        self.backend = backend
        self.dim = int(w.numel())
        self.hvp_count = 0
        self.keep_graph = keep_graph
        self.memory_budget = memory_budget
        self.progress = progress
        self.keeps_graph: bool | None = False if backend == "forward-over-reverse" or keep_graph is False else None
        self.graph_bytes: int | None = None
        # the backend the products use (auto: decided at the first product, with whether the graphs are kept)
        self.backend_used: str | None = None if backend == "auto" else backend
        self._graphs: list[tuple[float, Gradient]] = []
        self._leaves: ParameterLeaves | None = None
        self._rows: Tensor | None = None  # the kept-graph products' rows (matmat)
        self._n = len(objective.data)
        self._buffers = self._fixed_buffers()

    @property
    def dtype(self) -> torch.dtype:
        return self.w.dtype

    @property
    def device(self) -> torch.device:
        return self.w.device

    def _fixed_buffers(self) -> dict[str, Tensor | None]:
        """The buffers every product uses: the objective's buffers for w (recomputed once for ``recompute``).

        In ``train-batch-stats`` mode BatchNorm normalises by batch statistics and ignores its running
        statistics, which it would update in place; torch.func transforms refuse in-place updates of captured
        tensors, so the running statistics are passed as None (batch statistics, no update: the same function).
        """
        buffers: dict[str, Tensor | None] = dict(self.objective.buffers_for(self.w))
        if self.objective.bn_mode == "train-batch-stats":
            for prefix, module in self.objective.module.named_modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    for name, _ in module.named_buffers(recurse=False):
                        buffers[f"{prefix}.{name}" if prefix else name] = None
        return buffers

    def _batch_loss(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """f_b at w for the products: contiguous whatever layout the objective's evaluations use, so that no
        Hessian number depends on the layout's timing (channels-last products are not clearly faster on the
        CPU: landscape.core.memory_format)."""
        with self.objective.flat.layout(False):
            return self.objective.batch_loss(w, batch, self._buffers)

    def matmat(self, vectors: Tensor) -> Tensor:
        """H @ V for V of shape [dim, k]; counts k products.

        Under torchrun every rank takes its block of the batches (``parallel.shard``) and the partial sums
        are all-reduced: each batch keeps its single-process weight n_b / n (n: the whole data set), so the
        sum is the single-process one up to the order of the additions. Every rank must call this together.
        """
        vectors = self._as_columns(vectors)
        if vectors.shape[1] == 0:
            return torch.zeros_like(vectors)
        if self.keeps_graph is None:
            self._decide_graphs()
        if self.backend_used is None:
            self.backend_used = "double-backward"
        if self.keeps_graph:
            out = torch.zeros_like(vectors)
            if self._rows is None or self._rows.shape != vectors.T.shape:  # one [k, dim] tensor, reused: a new one
                self._rows = vectors.new_empty(vectors.T.shape)  # every product and batch costs its page faults
            for weight, grad in self._graphs:
                rows = self._rows.zero_()
                out += products.hvps_through(grad, self._leaves, vectors, keep=True, out=rows).mul_(weight)
            parallel.all_reduce_sum(out)
        else:
            out = self._recomputed_matmat(vectors)
        self._count(vectors.shape[1])
        return out

    def _count(self, products: int) -> None:
        self.hvp_count += products
        if self.progress is not None:
            self.progress(self.hvp_count, None)

    def _recomputed_matmat(self, vectors: Tensor) -> Tensor:
        """H @ V with every batch's gradient graph built afresh (not counted)."""
        out = torch.zeros_like(vectors)
        data = self.objective.data
        for start, stop in parallel.shard(data.batch_ranges()):
            out += (stop - start) / self._n * self._batch_hvps(data.batch(start, stop), vectors)  # weighted as in F
        parallel.all_reduce_sum(out)
        return out

    def _batch_hvps(self, batch: tuple[Tensor, Tensor], vectors: Tensor, backend: str | None = None) -> Tensor:
        """H_b V for one batch by ``backend`` (default: the one in use), the gradient graph built afresh."""
        if (backend or self.backend_used) == "double-backward":
            leaves = self.objective.flat.leaves(self.w)
            return products.hvps_through(self._gradient(leaves, batch), leaves, vectors, keep=False)
        return products.forward_over_reverse(lambda params: self._batch_loss(params, batch), self.objective.flat,
                                             self.w, vectors)

    def _gradient(self, leaves: ParameterLeaves, batch: tuple[Tensor, Tensor]) -> Gradient:
        """grad f_b at the leaves with its graph, per parameter (``products.batch_gradient``)."""
        return products.batch_gradient(lambda params: self._batch_loss(params, batch), leaves)

    def decide_backend(self) -> str:
        """The backend the products use (``backend_used``), decided now where it is not yet, as the first product
        would (auto: double-backward; the memory rule on the first batch's measured graph decides the keeping),
        keeping no graph: what a result records, and what later operators on the problem can be given."""
        if self.backend_used is None:
            data = self.objective.data
            ranges = parallel.shard(data.batch_ranges())
            leaves = self.objective.flat.leaves(self.w)
            size = self._measured_gradient(leaves, data.batch(*ranges[0]))[1] if ranges else 0
            self.graph_bytes = size * len(ranges)
            self.backend_used = "double-backward"
        return self.backend_used

    # -- kept graphs ------------------------------------------------------------------------------------------
    def _decide_graphs(self) -> None:
        """Build and keep every batch's gradient graph, or decide not to (the memory rule)."""
        data = self.objective.data
        ranges = parallel.shard(data.batch_ranges())
        leaves = self.objective.flat.leaves(self.w)
        graphs: list[tuple[float, Gradient]] = []
        for i, (start, stop) in enumerate(ranges):
            batch = data.batch(start, stop)
            if i == 0:
                grad, size = self._measured_gradient(leaves, batch)
                self.graph_bytes = size * len(ranges)  # the first batch is the largest
                if self.keep_graph is None and not self._fits(self.graph_bytes):
                    self.keeps_graph = False
                    return
            else:
                grad = self._gradient(leaves, batch)
            graphs.append(((stop - start) / self._n, grad))
        if not ranges and self.keep_graph is None and not self._fits(0):  # a rank without batches goes along
            self.keeps_graph = False
            return
        self._leaves, self._graphs, self.keeps_graph = leaves, graphs, True
        if self.backend == "auto":
            self.backend_used = "double-backward"

    def _fits(self, size: int) -> bool:
        """The memory rule: ``size`` bytes within the budget. For ``auto`` under torchrun: on every rank, so
        that all ranks take the same path."""
        budget = self.memory_budget
        if budget is None:
            free = free_memory(self.device)
            budget = None if free is None else int(KEEP_GRAPH_FRACTION * free)
        fits = budget is not None and size <= budget
        if self.backend == "auto" and parallel.is_distributed():
            agree = parallel.all_reduce_sum(torch.tensor([float(fits)], device=self.device))
            fits = int(agree.item()) == parallel.world_size()
        return fits

    def _measured_gradient(self, w: ParameterLeaves, batch: tuple[Tensor, Tensor]) -> tuple[Gradient, int]:
        """(grad f_b(w) with its graph, bytes of the tensors the graph saves): every storage counted once,
        except those of w, the data set, the batch's resident slices and the buffers (they exist anyway)."""
        data = self.objective.data
        existing = {t.untyped_storage().data_ptr() for t in (w.vector, data.x, data.y, *batch) if t is not None}
        existing |= {b.untyped_storage().data_ptr() for b in self._buffers.values() if b is not None}
        if data.streamed:  # the batch's device copies are kept with the graph
            existing -= {t.untyped_storage().data_ptr() for t in batch}
        return products.measured_gradient(lambda params: self._batch_loss(params, batch), w, existing)

    def release(self) -> None:
        """Free the kept graphs; the next product decides again (and rebuilds them where they fit)."""
        self._graphs, self._leaves, self.graph_bytes, self._rows = [], None, None, None
        if self.keeps_graph:
            self.keeps_graph = None
            if self.backend == "auto":
                self.backend_used = None

    # -- forward-over-reverse, the probe and the gradient ------------------------------------------------------
    def _probe_products(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """Hv as the solvers will get it (through kept graphs where they are kept) and Hv through graphs
        built afresh: a dropout mask or batch order frozen into a kept graph differs from a fresh one."""
        first = self.matvec(v)
        second = self._recomputed_matmat(self._as_columns(v, vector=True))[:, 0]
        self._count(1)
        return first, second

    def loss_and_grad(self) -> tuple[Tensor, Tensor]:
        """(F(w), grad F(w)) over the objective's data (no products counted)."""
        return self.objective.loss_and_grad(self.w)


class MatrixOperator(LinearOperator):
    """A dense symmetric matrix behind the same interface (reference computations and solver tests)."""

    def __init__(self, matrix: Tensor) -> None:
        if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
            raise LandscapeError(f"expected a square matrix, got shape {tuple(matrix.shape)}")
        self.matrix = matrix.detach()
        self.dim = int(matrix.shape[0])
        self.hvp_count = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.matrix.dtype

    @property
    def device(self) -> torch.device:
        return self.matrix.device

    def matmat(self, vectors: Tensor) -> Tensor:
        vectors = self._as_columns(vectors)
        self.hvp_count += vectors.shape[1]
        return self.matrix @ vectors
