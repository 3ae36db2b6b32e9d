"""The ``meshrun`` command: hands its arguments to the Rust command line."""

import signal
import sys

from meshrun import _native


def main() -> None:
    # The Rust command handles SIGINT itself (a clean stop of every worker).
    # Python's own handler would turn the same Ctrl-C into a
    # KeyboardInterrupt once the command returns, so hand it back to the OS.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Workers run under this interpreter; extra hosts' agents are started
    # as ``python -m meshrun agent``, so the same installation serves both.
    code = _native.cli(
        ["meshrun", *sys.argv[1:]],
        sys.executable,
        [sys.executable, "-m", "meshrun"],
    )
    sys.exit(code)


if __name__ == "__main__":
    main()
