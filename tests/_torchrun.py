"""Start a script under the real ``torchrun`` launcher (``torch.distributed.run``)
with a deadline, for the tests that check multi-process runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest


def run_torchrun(script: str, args: list[str], cwd, nproc: int = 2, deadline_s: float = 120) -> bytes:
    """Run ``script args`` in ``nproc`` processes on one machine, one torch
    thread each, with this checkout's ``backdrive`` first on the path; the
    test fails if the launcher fails or is still running after ``deadline_s``
    (then every worker is killed with it). Returns the combined output."""
    import backdrive

    src = os.path.dirname(os.path.dirname(backdrive.__file__))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "--max-restarts", "0", os.path.abspath(script), *args]
    # A session of its own, so a hung run is killed with every worker.
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun still running after {deadline_s} s:\n{output.decode()[-3000:]}")
    assert proc.returncode == 0, output.decode()[-3000:]
    return output
