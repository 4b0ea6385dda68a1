"""torch.distributed helpers: one process per rank under ``torchrun``, a plain single process otherwise.

``torchrun --nproc-per-node N -m landscape ...`` starts N processes with WORLD_SIZE, RANK, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set; ``session()`` (called by the command line's ``main``) joins them into one
process group: gloo for CPU tensors, and NCCL for CUDA tensors where CUDA exists (each rank on the GPU
``cuda:LOCAL_RANK``). Without those variables every helper here is a no-op (``world_size()`` is 1,
``shard`` returns everything, reductions return their input), so code written with them runs unchanged
in one process.

Who does what:

- every rank runs the same code and holds the same state; work is split with ``shard`` (contiguous,
  balanced blocks, in order) and joined with ``all_reduce_sum`` / ``all_gather_*``, so every rank ends with
  the same numbers and takes the same decisions (a rank that took another branch would wait forever in a
  collective the others never reach);
- rank 0 (``is_main()``) alone writes files and shows progress; ``on_main(fn)`` runs a step that touches
  the file system there and hands its result, or its error, to every rank;
- ``solo()`` turns the collectives off for a block of work that one rank does by itself (e.g. one
  checkpoint's analysis while the other ranks analyse other checkpoints): inside it ``world_size()`` is 1.

torch is imported on first use, so ``landscape --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from landscape.core.errors import LandscapeError

if TYPE_CHECKING:
    import torch
    from torch import Tensor

T = TypeVar("T")

_solo_depth = 0  # > 0 inside solo(): collectives are off


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher) as one of several ranks."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _initialized() -> bool:
    if "torch" not in sys.modules:  # nothing distributed can exist before torch is imported
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def is_distributed() -> bool:
    """A process group of several ranks is active (and not switched off by ``solo()``)."""
    return _solo_depth == 0 and _initialized() and _global_world_size() > 1


def _global_world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if _initialized() else 1


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _initialized() else 0


def world_size() -> int:
    """Ranks sharing the current work: 1 in a plain process and inside ``solo()``."""
    return _global_world_size() if is_distributed() else 1


def rank() -> int:
    """This process's place among ``world_size()`` ranks (0 in a plain process and inside ``solo()``)."""
    return _global_rank() if is_distributed() else 0


def local_rank() -> int:
    """This process's rank on its machine (torchrun's LOCAL_RANK; its GPU is cuda:LOCAL_RANK)."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def is_main() -> bool:
    """Rank 0 of the whole job: the one process that writes files and shows progress."""
    return _global_rank() == 0


# ----------------------------------------------------------------------------------------------------------
# joining and leaving


def init(backend: str | None = None) -> bool:
    """Join the process group that torchrun's environment describes; False (and nothing done) in a plain
    process. ``backend`` defaults to gloo for CPU tensors plus NCCL for CUDA tensors where CUDA exists."""
    if not launched() or _initialized():
        return _initialized()
    import torch
    import torch.distributed as dist

    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise LandscapeError(f"WORLD_SIZE is set but {', '.join(missing)} is not: start several ranks with "
                             "torchrun (torchrun --nproc-per-node N -m landscape ...)")
    if not dist.is_available():
        raise LandscapeError("this torch build has no torch.distributed; run landscape as one process")
    cuda = torch.cuda.is_available()
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if cuda and dist.is_nccl_available() else "gloo"
    if cuda:
        if local_rank() >= torch.cuda.device_count():
            raise LandscapeError(f"LOCAL_RANK {local_rank()} has no GPU: this machine shows "
                                 f"{torch.cuda.device_count()}; start at most that many ranks per machine")
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend=backend, init_method="env://")
    return True


def shutdown() -> None:
    """Leave the process group (when one was joined)."""
    if _initialized():
        import torch.distributed as dist

        dist.destroy_process_group()


@contextlib.contextmanager
def session() -> Iterator[None]:
    """The command line's frame: join torchrun's process group, keep standard output for rank 0 (the
    other ranks compute the same results and would print them again), leave the group at the end. Errors
    still reach standard error from every rank. A plain process: nothing happens."""
    if not launched():
        yield
        return
    try:
        init()
    except LandscapeError as e:  # before the command line's own error handling: the same one line
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        with contextlib.ExitStack() as stack:
            if not is_main():
                stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
            yield
    finally:
        shutdown()


@contextlib.contextmanager
def solo() -> Iterator[None]:
    """Work that this rank does alone: collectives are off inside (``world_size()`` is 1, ``shard`` returns
    everything). ``is_main()`` still names the one process that writes files."""
    global _solo_depth
    _solo_depth += 1
    try:
        yield
    finally:
        _solo_depth -= 1


# ----------------------------------------------------------------------------------------------------------
# splitting work


def shard_bounds(count: int, ranks: int | None = None, index: int | None = None) -> tuple[int, int]:
    """[start, stop) of this rank's block of ``count`` items: contiguous, in order, sizes differing by at
    most one (the first count % ranks ranks take one more)."""
    ranks = world_size() if ranks is None else ranks
    index = rank() if index is None else index
    base, extra = divmod(count, ranks)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def shard(items: Sequence[T]) -> list[T]:
    """This rank's contiguous block of ``items``; concatenating the blocks of ranks 0, 1, ... gives back
    ``items`` in order. Everything in a single process."""
    start, stop = shard_bounds(len(items))
    return list(items[start:stop])


# ----------------------------------------------------------------------------------------------------------
# collectives (no-ops in a single process)


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum ``tensor`` over the ranks, in place; every rank receives the same sum. Returns ``tensor``."""
    if is_distributed():
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj: Any) -> list[Any]:
    """[object of rank 0, of rank 1, ...] on every rank (pickled: for small things, not model tensors)."""
    if not is_distributed():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (pickled: small things)."""
    if not is_distributed():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def _to_bytes(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    import torch

    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat([p.to(device) for p in parts])


def _from_bytes(buffer: Tensor, layout: Sequence[tuple[Any, tuple[int, ...]]]) -> list[Tensor]:
    import torch

    out, offset = [], 0
    for dtype, shape in layout:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        # clone: a fresh, aligned storage before reinterpreting the bytes as ``dtype``
        out.append(buffer[offset : offset + nbytes].clone().view(dtype).reshape(shape))
        offset += nbytes
    return out


def all_gather_tensors(tensors: Sequence[Tensor], device: torch.device | str) -> list[list[Tensor]]:
    """Every rank's list of tensors (any number, shapes and dtypes per rank), bit for bit, on every rank:
    [tensors of rank 0, of rank 1, ...], on ``device`` (the same device type on every rank: gloo moves CPU
    tensors, NCCL CUDA tensors). One collective for the bytes, one for the shapes."""
    import torch

    device = torch.device(device)
    if not is_distributed():
        return [[t.to(device) for t in tensors]]
    import torch.distributed as dist

    layouts = all_gather_objects([(t.dtype, tuple(t.shape)) for t in tensors])
    payload = _to_bytes(tensors, device)
    sizes = [sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size() for d, s in lay)
             for lay in layouts]
    longest = max(sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    received = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in layouts]
    dist.all_gather(received, padded)
    return [_from_bytes(buffer[:size], layout) for buffer, size, layout in zip(received, sizes, layouts)]


def broadcast_tensors(tensors: Sequence[Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` (the same shapes and dtypes on every rank) with rank ``src``'s values, in place."""
    if not is_distributed():
        return
    import torch.distributed as dist

    for t in tensors:
        dist.broadcast(t, src=src)


# ----------------------------------------------------------------------------------------------------------
# rank 0's side effects


def on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` (file system work: checks, locks, writes) on rank 0 only; every rank returns its result,
    or raises the ``LandscapeError`` it raised. The result is pickled to the other ranks: keep it small."""
    if not is_distributed():
        return fn()
    result: Any = None
    error: LandscapeError | None = None
    if is_main():
        try:
            result = fn()
        except LandscapeError as e:
            error = e
    result, message = broadcast_object((result, None if error is None else str(error)))
    if error is not None:
        raise error
    if message is not None:
        raise LandscapeError(message)
    return result


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. a download into a shared folder), the other ranks after it."""
    if not is_distributed():
        yield
        return
    if not is_main():
        barrier()
    try:
        yield
    finally:
        if is_main():
            barrier()
