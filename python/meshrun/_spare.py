"""A warm standby worker: ``python -m meshrun._spare``, started by a host's
agent ahead of a restart.

It imports meshrun's worker side and the modules named in
``MESHRUN_SPARE_IMPORTS`` (each where installed), then waits on its
standard input for one line: the attempt it takes over (its environment,
working folder and the bootstrap's arguments). It then runs exactly as a
worker started cold would (:mod:`meshrun._bootstrap`). Its environment
already holds everything JAX reads when it is imported; the agent hands a
spare only an attempt whose launch agrees on all of it. Input that closes
before a line (the agent is gone, or the run is over) ends it quietly.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from meshrun import _bootstrap, _goodput
from meshrun._native import ENV

_IMPORTS_ENV = ENV["spare_imports"]


def _warm(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # not installed here: the program does not use it
        except Exception as exc:  # noqa: BLE001  (a module failing at import)
            print(f"meshrun spare: importing {name} failed ahead of the attempt: {exc!r}", file=sys.stderr, flush=True)


def main() -> None:
    _warm([n for n in os.environ.pop(_IMPORTS_ENV, "").split(",") if n])
    line = sys.stdin.readline()
    if not line:
        return
    job = json.loads(line)
    _goodput.handed_over()
    # The worker's standard input is empty, as a cold worker's is.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    os.chdir(job["cwd"])
    os.environ.update(job["env"])
    _bootstrap.main(job["argv"])


if __name__ == "__main__":
    main()
