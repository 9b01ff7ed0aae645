"""backdrive._shapes.broadcast_shapes agrees with torch.broadcast_shapes."""

import itertools
import random

import pytest
import torch

from backdrive._shapes import broadcast_shapes


def _random_shapes(rng: random.Random, count: int):
    full = [rng.choice([1, 2, 3, 5]) for _ in range(rng.randint(0, 4))]
    shapes = []
    for _ in range(count):
        k = rng.randint(0, len(full))
        tail = full[len(full) - k :]
        shapes.append(tuple(1 if rng.random() < 0.3 else d for d in tail))
    return shapes


def test_agrees_with_torch_on_broadcastable_shapes():
    rng = random.Random(0)
    for _ in range(500):
        shapes = _random_shapes(rng, rng.randint(1, 4))
        assert broadcast_shapes(*shapes) == torch.broadcast_shapes(*shapes), shapes
    assert broadcast_shapes() == torch.broadcast_shapes() == torch.Size([])


@pytest.mark.parametrize("a,b", [((3,), (4,)), ((2, 3), (3, 2)), ((5, 1, 3), (2, 4))])
def test_mismatch_raises_like_torch(a, b):
    with pytest.raises(RuntimeError):
        torch.broadcast_shapes(a, b)
    with pytest.raises(RuntimeError, match=r"cannot be broadcast.*\(3,\)|cannot be broadcast"):
        broadcast_shapes(a, b)


def test_zero_sized_dimensions():
    for a, b in itertools.product([(0,), (1,), (0, 1), (2, 0)], repeat=2):
        try:
            want = torch.broadcast_shapes(a, b)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                broadcast_shapes(a, b)
        else:
            assert broadcast_shapes(a, b) == want
