"""The Hessian of the analysis objective as a linear operator: ``H @ v`` by Hessian-vector products.

``HessianOperator(objective, w)`` is grad^2 F(w) for the objective's data set, applied without ever forming
the matrix (curvlinops / hessian-eigenthings style): ``op @ v``, ``op.matmat(V)``, ``op.dim``,
``op.hvp_count``. One product streams over the objective's fixed batches, holding one batch's graph at a
time, and sums (n_b / n) * H_b v, so batches are weighted by their size exactly as F weights them. Under
torchrun the batches are split across the ranks and the sum is all-reduced (``matmat``).

Two ways to compute H_b v, equal up to rounding:

- ``double-backward``: v . grad f_b differentiated once more (reverse-over-reverse, Pearlmutter's trick);
  a matmat of k columns builds each batch's gradient graph once and back-propagates it k times.
- ``forward-over-reverse``: the directional derivative of the gradient function, ``torch.func.jvp`` of
  ``torch.func.grad`` (usually the cheaper of the two on GPUs).

The model is used through ``torch.func.functional_call`` (``Objective``), so parameters, ``requires_grad``,
training flags and ``.grad`` are never touched. BatchNorm buffers are fixed at w when the operator is built
(for ``recompute``: the statistics recomputed at w are constants of H, not functions of w).

Solvers (``landscape.analyze.spectrum``) trust an operator only if it is a deterministic function of v;
``check_determinism`` probes that and names the usual culprits when it is not.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from landscape import parallel
from landscape.analyze.objective import Objective
from landscape.errors import LandscapeError

BACKENDS = ("double-backward", "forward-over-reverse")

# Relative agreement two evaluations of Hv must reach (check_determinism). Reductions are the only rounding
# differences a deterministic computation has, so far below what a dropout mask or a shuffled batch causes.
DETERMINISM_RTOL = {torch.float64: 1e-10, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}


class LinearOperator(ABC):
    """A symmetric operator on vectors of length ``dim``: what the solvers in ``spectrum`` need.

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
        first, second = self.matvec(v), self.matvec(v)
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


class HessianOperator(LinearOperator):
    """grad^2 F(w) of ``objective`` at ``w`` as a linear operator (see the module docstring)."""

    def __init__(self, objective: Objective, w: Tensor, backend: str = "double-backward") -> None:
        if backend not in BACKENDS:
            raise LandscapeError(f"unknown Hessian backend '{backend}'; choose from: {', '.join(BACKENDS)}")
        if w.dim() != 1 or w.numel() != objective.flat.dim:
            raise LandscapeError(
                f"w must be a flat vector of the model's {objective.flat.dim} parameters, got shape {tuple(w.shape)}"
            )
        self.objective = objective
        self.w = w.detach()
        self.backend = backend
        self.dim = int(w.numel())
        self.hvp_count = 0
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
        return self.objective.batch_loss(w, batch, self._buffers)

    def matmat(self, vectors: Tensor) -> Tensor:
        """H @ V for V of shape [dim, k]; counts k products.

        Under torchrun every rank takes its block of the batches (``parallel.shard``) and the partial sums
        are all-reduced: each batch keeps its single-process weight n_b / n (n: the whole data set), so the
        sum is the single-process one up to the order of the additions. Every rank must call this together.
        """
        vectors = self._as_columns(vectors)
        out = torch.zeros_like(vectors)
        if vectors.shape[1] == 0:
            return out
        data = self.objective.data
        for start, stop in parallel.shard(data.batch_ranges()):
            batch = data.batch(start, stop)
            weight = (stop - start) / self._n  # batches weighted by size, as in F
            if self.backend == "double-backward":
                out += weight * self._batch_hvps_double_backward(batch, vectors)
            else:
                out += weight * self._batch_hvps_forward_over_reverse(batch, vectors)
        parallel.all_reduce_sum(out)
        self.hvp_count += vectors.shape[1]
        return out

    def _batch_hvps_double_backward(self, batch: tuple[Tensor, Tensor], vectors: Tensor) -> Tensor:
        w = self.w.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(self._batch_loss(w, batch), w, create_graph=True)
        if not grad.requires_grad:  # f_b is (piecewise) linear in w on this batch: H_b = 0
            return torch.zeros_like(vectors)
        columns = []
        for j in range(vectors.shape[1]):
            last = j == vectors.shape[1] - 1
            (hv,) = torch.autograd.grad(
                grad, w, grad_outputs=vectors[:, j], retain_graph=not last, allow_unused=True
            )
            columns.append(torch.zeros_like(w) if hv is None else hv)  # None: the gradient is constant in w
        return torch.stack(columns, dim=1)

    def _batch_hvps_forward_over_reverse(self, batch: tuple[Tensor, Tensor], vectors: Tensor) -> Tensor:
        gradient = torch.func.grad(lambda u: self._batch_loss(u, batch))
        columns = [torch.func.jvp(gradient, (self.w,), (vectors[:, j],))[1] for j in range(vectors.shape[1])]
        return torch.stack(columns, dim=1)

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
