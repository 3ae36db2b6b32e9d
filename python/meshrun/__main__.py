"""The ``meshrun`` command: hands its arguments to the Rust command line."""

import sys

from meshrun import _native


def main() -> None:
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
