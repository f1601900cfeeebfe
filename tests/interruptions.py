"""Runs stopped at a chosen step, for the resume tests: by an exception, or by SIGKILL in a child process."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import flowkit
from flowkit.train import Callback


class Killed(Exception):
    """What `KillAt` raises: the run stops as a killed process would, between two checkpoints."""


class KillAt(Callback):
    """Raise `Killed` at the end of step `step`, after the other callbacks and before that step's checkpoint."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, state) -> None:
        if state.step == self.step:
            raise Killed


_CHILD = """
import os, signal, sys, torch
sys.path[:0] = [{tests!r}, {here!r}]
import interruptions
interruptions.KillAt.on_step_end = lambda self, state: state.step == self.step and os.kill(os.getpid(), signal.SIGKILL)
import {module} as module
torch.set_num_threads(1)
module.{call}
"""


def run_killed_by_sigkill(test_file: str, call: str) -> None:
    """Run `call` (Python, in the test module `test_file`) in a child process whose `KillAt` sends SIGKILL to itself.

    Nothing of the killed process is left but what it wrote; the child imports the flowkit under test.
    """
    here = Path(test_file).parent
    script = _CHILD.format(tests=str(Path(__file__).parent), here=str(here), module=Path(test_file).stem, call=call)
    root = str(Path(flowkit.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
