"""Safe file writing: atomic writes, one-line OS errors, and the exclusive lock of a run directory.

Every file is written atomically (``atomic_write``: temporary file in the same folder, fsync, rename), never
through a symbolic link: a link in place of the file is replaced (its target untouched), and a write inside a run
directory whose way down from the run passes a link (``analysis`` or ``checkpoints`` or a round folder linked to a
folder outside) is refused in one line naming the link (``refuse_links``), so nothing outside a run is written. A process that trains into a run directory holds an exclusive lock on it
(``RunLock``: flock on ``<run>/.lock``, gone with the process).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from landscape.core.errors import LandscapeError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, runs are not locked
    fcntl = None

LOCK_NAME = ".lock"
# The file that marks a folder as a run directory this tool made (``directory.RunDir.mark``).
RUN_MARKER = ".landscape-run"


def os_reason(error: OSError) -> str:
    """'[Errno 28] No space left on device' (without the file name that OSError's str may append)."""
    if error.errno is not None and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}"
    return str(error) or type(error).__name__


def _file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # files this tool writes are never opened through a symbolic link
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO in place of a file does not hang the open


def open_no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | _NOFOLLOW, _FILE_MODE)


def _is_run(folder: Path) -> bool:
    """A run directory: marked by this tool, or (made before the marker) a recipe.toml with a run's files."""
    try:
        return (folder / RUN_MARKER).is_file() or ((folder / "recipe.toml").is_file() and (
            (folder / "checkpoints").is_dir() or (folder / "partition.json").is_file()))
    except OSError:
        return False


def link_in_run(path: str | Path, *, itself: bool = False) -> tuple[Path, Path] | None:
    """(the link, the run) when the way down from a run directory to ``path``'s folder (``itself``: to ``path``)
    passes a symbolic link: the link nearest the run; None otherwise. The folders are taken as written (not
    resolved): a run reached through a link of its own, or a link above it, is the user's and fine."""
    path = Path(os.path.abspath(path))
    links: list[Path] = []
    for folder in ([path] if itself else []) + list(path.parents):
        if links and _is_run(folder):
            return links[-1], folder
        if folder.is_symlink():
            links.append(folder)
    return None


def _through_link(doing: str, link: Path, run: Path) -> str:
    return (f"cannot {doing}: {link} is a symbolic link in the run {run}; nothing is written outside a run through "
            "a link: remove the link (a run holds plain folders)")


def refuse_links(path: str | Path, *, itself: bool = False, what: str = "write") -> None:
    """A one-line LandscapeError when writing ``path`` inside a run would follow a symbolic link planted in it
    (``link_in_run``): nothing outside a run is written through a link."""
    found = link_in_run(path, itself=itself)
    if found is not None:
        link, run = found
        raise LandscapeError(_through_link(f"{what} {path}", link, run))


# The folders of a run that its writers write into (``analysis/round-NNNN`` too): none may be a link.
RUN_FOLDERS = ("checkpoints", "analysis", "tensorboard", "wandb", "figures")


def refuse_planted_links(run: str | Path) -> None:
    """One line naming the first of a run's folders (``RUN_FOLDERS``, the round folders under analysis/) that is
    a symbolic link: checked before a process writes into the run (``RunLock.acquire``), so that nothing is
    written, moved aside or replaced outside it."""
    run = Path(run)
    for name in RUN_FOLDERS:
        folder = run / name
        found = [folder] if folder.is_symlink() else []
        if not found and name == "analysis" and folder.is_dir():
            with contextlib.suppress(OSError):
                found = sorted(p for p in folder.iterdir() if p.is_symlink())
        if found:
            raise LandscapeError(_through_link("write into the run", found[0], run))


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through ``write(file)`` into a temporary file beside ``path``, then rename it over ``path``.

    Either the whole new file is in place or the old one is untouched, and no temporary file is left (a
    killed process may leave one: ``.<name>.<random>.tmp``, which no reader takes for a result). A failed
    write (full disk, read-only folder), and a write inside a run through a link planted in it
    (``refuse_links``), raise a one-line LandscapeError naming the file.
    """
    path = Path(path)
    refuse_links(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise LandscapeError(f"cannot write {path}: {os_reason(e)}") from None
    try:
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; results are ordinary files (0666 less the umask)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise LandscapeError(f"cannot write {path}: {os_reason(e)}") from None
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:  # the rename is done; only its durability could not be confirmed
        raise LandscapeError(f"cannot write {path}: {os_reason(e)}") from None


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


class RunLock:
    """The exclusive lock of a process that trains into a run directory: ``flock`` on ``<run>/.lock``.

    A second process is refused with a one-line error naming the directory. The lock dies with its process
    (also on SIGKILL); a clean exit removes the lock file too. Analysis does not take it: it only adds files
    under analysis/.
    """

    def __init__(self, run_dir: Any) -> None:  # a directory.RunDir (fileio never imports directory)
        self.run_dir = run_dir
        self.path = run_dir.path / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        where = self.run_dir.path
        refuse_planted_links(where)
        if fcntl is None or self._fd is not None:
            return self
        for _ in range(10):
            try:  # never through a symbolic link: the lock file is written (the pid)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o644)
            except OSError as e:
                if self.path.is_symlink():
                    raise LandscapeError(f"cannot lock {where}: {self.path.name} is a symbolic link; a lock file is "
                                         "a plain file this tool makes: remove the link") from None
                raise LandscapeError(f"cannot lock {where}: {os_reason(e)}") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise LandscapeError(f"cannot lock {where}: {self.path.name} is not a plain file; a lock file is a "
                                     "plain file this tool makes: remove it")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                pid = f" (pid {holder})" if holder.isdigit() else ""
                raise LandscapeError(f"{where} is in use by another landscape process{pid}: two processes never "
                                     "train into one run directory; wait for it to finish") from None
            except OSError as e:
                os.close(fd)
                raise LandscapeError(f"cannot lock {where}: {os_reason(e)}") from None
            try:  # the file may have been removed by a holder that released it meanwhile: lock the new one
                st = os.stat(self.path)
                same = (st.st_ino, st.st_dev) == (os.fstat(fd).st_ino, os.fstat(fd).st_dev)
            except FileNotFoundError:
                same = False
            if same:
                with contextlib.suppress(OSError):  # the pid is only a hint for the message of others
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._fd = fd
                return self
            os.close(fd)
        raise LandscapeError(f"cannot lock {where}: its lock file keeps changing")

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # while still held: a process that waits then locks a new file
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(run_path: Path) -> str | None:
    """Whether another process holds the ``RunLock`` of the run directory at ``run_path`` (it is training
    into it now): None when none does (no lock file, or one nobody holds), else the holder in words ('pid
    1234', or '' where the file names none). Creates nothing; a lock file that is not a plain file is no
    lock. Meant for messages: the answer may change the moment after."""
    if fcntl is None:  # pragma: no cover - Windows: runs are not locked
        return None
    path = Path(run_path) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"pid {holder}" if holder.isdigit() else ""
        except OSError:
            return None
        return None
    finally:
        os.close(fd)  # closing it releases the shared lock taken to ask
