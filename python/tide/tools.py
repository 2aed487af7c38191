"""The command-line tools of an installed package: `tide-bench` and `tide-plan`.

`pip install .` puts the C programs inside the package (tide/bin/); these entry points run
them with the caller's arguments, so `tide-bench ...` and `python -m tide.bench ...` behave
exactly like the programs built by CMake.  In a source checkout that was not installed, the
repository's build/ folder is used instead.
"""

import os
import pathlib
import sys


def _program(name):
    here = pathlib.Path(__file__).resolve().parent
    candidates = [here / "bin" / name, here.parents[1] / "build" / name]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    sys.stderr.write("%s: program not found (tried %s). It is built with libtide when libcjson is "
                     "installed (Debian: libcjson-dev); reinstall with `pip install .` or build "
                     "it with CMake.\n" % (name, ", ".join(str(p) for p in candidates)))
    return None


def _exec(name, argv):
    path = _program(name)
    if path is None:
        return 2
    sys.stdout.flush()
    os.execv(path, [name] + list(argv))
    return 2  # not reached


def bench_main(argv=None):
    """Entry point of `tide-bench`."""
    return _exec("tide-bench", sys.argv[1:] if argv is None else argv)


def plan_main(argv=None):
    """Entry point of `tide-plan`."""
    return _exec("tide-plan", sys.argv[1:] if argv is None else argv)
