"""Printed commands run as processes without paying the imports each time: a *warm launcher*.

A ``landscape`` command or a ``python -c`` block spends seconds importing torch, numpy, scipy, scikit-learn,
matplotlib and the package before it does anything; the pages' ~80 commands paid that ~80 times, most of
tests/test_readme.py's time. The launcher is one Python process, started in the commands' folder with their
environment, that imports those modules once (nothing more: no torch operation runs, no thread starts) and then
forks a child per command. Each child is a process of its own as before, and it runs what the console script or
``python -c`` would run, as they would:

- a ``landscape`` command: the console script's entry point read from the installed distribution's metadata
  (``landscape = landscape.cli:main``), ``sys.argv[0]`` the script's path and ``sys.path[0]`` its folder, exactly
  as the script sets them (so the current folder is not searched, as for the installed command);
- a Python block: compiled as ``<string>`` and run in ``__main__`` with ``sys.path[0] == ""`` and
  ``sys.argv == ["-c"]``, as ``python -c`` does; a script (``python FILE ARGS``) run as ``__main__`` with its
  folder as ``sys.path[0]`` and ``sys.argv == [FILE, ARGS...]``, as ``python FILE`` does;
- ``PYTHONPATH=...`` before a command: set in the environment and its folders put after ``sys.path[0]``, as
  the interpreter puts them; a request's own folder (``cwd``) is changed to before anything runs;
- stdout and stderr go to files of their own, stdin is /dev/null, and the child ends as an interpreter ends
  (exit functions run, a traceback and exit status 1 on an uncaught exception, ``SystemExit``'s code).

What differs from a fresh process is only that the listed modules are already in ``sys.modules``. Whatever needs
a fresh process (which modules a command imports, the console script itself) is tested with real processes
elsewhere (tests/test_layers.py, tests/cli/test_cli.py::test_real_subprocess).
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

# the modules every command imports or most do, imported once by the launcher
WARM_MODULES = ("torch", "numpy", "scipy.stats", "sklearn.datasets", "matplotlib.pyplot", "landscape.cli",
                "landscape.workflows.analysis", "landscape.workflows.figure", "landscape.train.loop")

# The launcher's own code (run as ``python -c``). It reads one JSON request per line: {"argv": [...]} for the
# console script or {"code": "..."} for a Python block, with the paths of the child's stdout and stderr and a
# timeout; it forks, waits, and answers {"returncode": N, "timed_out": bool}. Only the child returns from
# serve(); it then runs the request as the last statement of this script, so it ends as the interpreter ends.
LAUNCHER = r'''
import sys
scripts = sys.argv[1]
sys.path[0] = scripts  # while importing, as for the console script: the current folder is not searched
import json, os, signal, time
from importlib import import_module
for name in sys.argv[2].split(","):
    import_module(name)


def serve():
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        deadline, status, timed_out = time.monotonic() + request["timeout"], None, False
        while status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = code
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                status, timed_out = os.waitpid(pid, 0)[1], True
            else:
                time.sleep(0.01)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}), flush=True)
    os._exit(0)  # stdin closed: done (the launcher itself has nothing to write or clean)


def child(request):
    import builtins
    from importlib.metadata import entry_points

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    if request.get("cwd") is not None:
        os.chdir(request["cwd"])
    if request.get("pythonpath") is not None:  # as the interpreter reads PYTHONPATH: after sys.path[0]
        os.environ["PYTHONPATH"] = request["pythonpath"]
        sys.path[1:1] = [os.path.abspath(p) for p in request["pythonpath"].split(os.pathsep) if p]
    if "argv" in request:  # the console script
        (script,) = entry_points(group="console_scripts", name=request["argv"][0])
        sys.argv = [os.path.join(scripts, request["argv"][0]), *request["argv"][1:]]
        sys.exit(script.load()())
    if "script" in request:  # python FILE ARGS...
        import runpy
        sys.argv = [request["script"], *request["args"]]
        sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
        runpy.run_path(request["script"], run_name="__main__")
        return
    sys.argv, sys.path[0] = ["-c"], ""  # python -c
    code = compile(request["code"], "<string>", "exec")
    namespace = sys.modules["__main__"].__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __builtins__=builtins)
    exec(code, namespace)


def end(run, request):
    """Run the request and end as the interpreter ends: the exit status of SystemExit's code (its text on
    stderr and 1 when it is not a number), a traceback and 1 on an uncaught exception; then wait for the
    threads, run the exit functions and flush. What it skips is only the teardown of the modules (a second
    and more with torch imported), which writes nothing."""
    import atexit  # imported here: a Python block's run empties this script's globals
    import os
    import sys
    import threading
    try:
        run(request)
        status = 0
    except SystemExit as stop:
        status = 0 if stop.code is None else stop.code
        if not isinstance(status, int):
            print(status, file=sys.stderr)
            status = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status & 0xFF)


end(child, serve())
'''


class WarmLauncher:
    """One warm launcher for the commands run in ``cwd`` with ``env`` (see the module's docstring)."""

    def __init__(self, cwd: Path, env: dict, timeout: float):
        self.cwd, self.timeout = cwd, timeout
        self.outputs = Path(tempfile.mkdtemp(prefix="warm-"))
        scripts = sysconfig.get_path("scripts")
        self.process = subprocess.Popen([sys.executable, "-c", LAUNCHER, scripts, ",".join(WARM_MODULES)],
                                        cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)

    def _run(self, args, request: dict) -> subprocess.CompletedProcess:
        out, err = self.outputs / "stdout", self.outputs / "stderr"
        request = {**request, "stdout": str(out), "stderr": str(err), "timeout": self.timeout}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the warm launcher ended (exit {self.process.wait()})")
        answer = json.loads(answer)
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(args, self.timeout)
        return subprocess.CompletedProcess(args, answer["returncode"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def console_script(self, argv: list[str], assigned: dict | None = None) -> subprocess.CompletedProcess:
        """``argv`` (the script's name first) as the installed console script runs it, with ``assigned``'s
        PYTHONPATH if it holds one (its only variable: the others a process reads as it starts are not
        emulated)."""
        if set(assigned or {}) - {"PYTHONPATH"}:
            raise ValueError(f"only PYTHONPATH can be assigned, not {sorted(assigned)}")
        return self._run(argv, {"argv": argv, "pythonpath": (assigned or {}).get("PYTHONPATH")})

    def python(self, code: str, cwd: Path | None = None, pythonpath: str | None = None) -> subprocess.CompletedProcess:
        """``code`` as ``python -c`` runs it, in ``cwd`` (the launcher's folder if None) with ``pythonpath`` as
        PYTHONPATH (as in :meth:`console_script`)."""
        return self._run([sys.executable, "-c", code], {"code": code, "pythonpath": pythonpath,
                                                         "cwd": None if cwd is None else str(cwd)})

    def script(self, path: str, args: list[str]) -> subprocess.CompletedProcess:
        """``python path args...``: the file run as ``__main__`` with its folder first on ``sys.path``."""
        return self._run([sys.executable, path, *args], {"script": path, "args": args})

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        for path in self.outputs.iterdir():
            path.unlink()
        self.outputs.rmdir()
