"""Fixtures the python tests share."""

import os
import pathlib
import subprocess
import sys
import time

import pytest


@pytest.fixture
def exit_script(tmp_path):
    """run(source) runs `source` as a script in a fresh interpreter with this checkout's tide
    first on PYTHONPATH.  The script prints "exiting at <time.monotonic()>" as its last line;
    the run must exit 0 and the interpreter's shutdown after that line must take moments, not
    a deadline (CLOCK_MONOTONIC is system-wide).  Returns the completed process."""
    import tide

    def run(source):
        script = tmp_path / "exit_script.py"
        script.write_text(source)
        env = dict(os.environ)
        pkg = str(pathlib.Path(tide.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=120)
        ended = time.monotonic()
        assert proc.returncode == 0, proc.stderr
        assert "exiting at " in proc.stdout, proc.stdout
        exiting = float(proc.stdout.split("exiting at ")[1].split()[0])
        assert ended - exiting < 5.0, "the interpreter took %.1f s to exit" % (ended - exiting)
        return proc

    return run
