"""A browser preview of the rollout with its most sensitive joints traced (backdrive.viz, imported lazily)."""

from __future__ import annotations

from pathlib import Path

from .._errors import InputError

__all__ = ["preview_sensitivity", "most_sensitive_joints"]


def most_sensitive_joints(sens, top: int = 3) -> list[tuple[str, float]]:
    """``top`` driven joints by the norm of their gradient over all steps, largest first: ``[(name, norm)]``."""
    if not isinstance(top, int) or top < 1:
        raise InputError(f"top must be a positive integer, got {top!r}")
    norms = sens.controls.norm(dim=0)
    order = norms.argsort(descending=True)[:top].tolist()
    return [(sens.joint_names[j], float(norms[j])) for j in order]


def preview_sensitivity(sens, path, *, top: int = 3, slow_motion: float = 10.0) -> Path:
    """Write an offline HTML preview of the nominal rollout with the ``top`` most sensitive joints traced.

    Each highlighted joint's moving link has its origin drawn as a labelled
    path over the whole rollout (``backdrive.viz.preview``'s ``paths``), and
    the caption ranks the joints with their gradient norms.

    Args:
        sens: :class:`~backdrive.analysis.Sensitivity` of a robot simulator.
        path: output ``.html`` file.
        top: how many joints to highlight.
        slow_motion: playback is this many times slower than real time.

    Raises:
        MissingExtraError: viser is not installed (``pip install 'backdrive[viz]'``).
    """
    robot = sens.sim.robot
    if robot is None:
        raise InputError("preview_sensitivity needs a robot simulator")
    if not slow_motion > 0:
        raise InputError(f"slow_motion must be positive, got {slow_motion!r}")
    from ..viz import preview

    ranked = most_sensitive_joints(sens, top)
    paths = {}
    for i, (joint, _) in enumerate(ranked):
        body = robot.body_joint_names.index(joint)
        paths[f"{i + 1}. {joint}"] = robot.body_names[body]
    words = ", ".join(f"{i + 1}. {j} ({n:.3g})" for i, (j, n) in enumerate(ranked))
    title = f"{sens.metric_name} = {sens.value:.4g}: most sensitive joints {words}"
    return preview(
        robot, sens.trajectory.q, paths=paths, path=path, fps=1.0 / (sens.dt * slow_motion), title=title
    )
