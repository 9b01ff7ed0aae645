"""``examples/rollout_processes.py``: a contact rollout split over processes.

Two processes under the real launcher (``torch.distributed.run``, gloo) give
the final states of one process simulating the whole batch, and a batch that
does not split is refused. The run has a deadline: a hung launcher fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from _torchrun import run_torchrun

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rollout_processes.py"
DEADLINE_S = 180
BATCH, STEPS = 8, 30


def _example():
    spec = importlib.util.spec_from_file_location("rollout_processes", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_two_processes_give_the_one_process_rollout(tmp_path):
    out = tmp_path / "two.pt"
    output = run_torchrun(str(EXAMPLE), ["--batch", str(BATCH), "--steps", str(STEPS), "--out", str(out)], tmp_path,
                          deadline_s=DEADLINE_S)
    assert b"on 2 process(es)" in output
    two = torch.load(out, weights_only=True)
    one = _example().main(["--batch", str(BATCH), "--steps", str(STEPS)])
    assert two["world"] == 2 and one["world"] == 1
    assert two["q"].shape == one["q"].shape == (BATCH, 19)
    # Each robot is simulated on its own: the split changes nothing but the kernels' batch.
    torch.testing.assert_close(two["q"], one["q"], rtol=0, atol=1e-12)
    torch.testing.assert_close(two["v"], one["v"], rtol=0, atol=1e-10)
    # The robots landed and stand: feet on the floor, base at rest height, slow.
    assert torch.isfinite(one["q"]).all()
    assert float(one["q"][:, 2].min()) > 0.25 and float(one["v"].abs().max()) < 0.5


def test_a_batch_that_does_not_split_is_refused():
    mod = _example()
    with pytest.raises(ValueError, match="does not split into 3"):
        mod.simulate(mod.build(), 8, 2, rank=0, world=3)
