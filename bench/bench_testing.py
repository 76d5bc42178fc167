"""What the tests of bench/prefill.py and bench/decode.py share: the command
lines a run would start (without starting them), and a fake `cuflash`
command that prints one JSON row, then a line that is not JSON, and fails."""

from __future__ import annotations

import os
import stat
import subprocess
import textwrap


def captured_commands(run) -> tuple[list, object]:
    """The command lines `run()` hands to subprocess.Popen (which runs nothing), and run's result."""
    captured = []
    real_popen = subprocess.Popen

    def spy(command, **kwargs):
        captured.append(command)
        raise OSError("not run")
    subprocess.Popen = spy
    try:
        result = run()
    finally:
        subprocess.Popen = real_popen
    return captured, result


def write_fake_cuflash(path: str, json_line: str) -> None:
    """An executable shell script at `path` that prints `json_line`, then
    'not json', and exits with 1 (as `cuflash bench` does when a point failed)."""
    with open(path, "w") as f:
        f.write(textwrap.dedent(f"""\
            #!/bin/sh
            echo '{json_line}'
            echo 'not json'
            exit 1
            """))
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
