"""Why a motion turned out as it did: sensitivity of an outcome to every command.

:func:`sensitivity` differentiates a scalar metric of one rollout (foot slip,
final base height, tracking error, peak contact force, energy, end-effector
error, or any differentiable function of the trajectory) with respect to
every actuator command at every step, the initial state and named physical
parameters. ``Sensitivity.report(top)`` ranks command changes in plain words
and checks each by re-simulation, marking contact switches. See
``docs/analysis.md``.
"""

from ._io import TRAJECTORY_KEYS, load_trajectory, save_trajectory
from ._metrics import METRICS, make_metric
from ._plot import plot_sensitivity
from ._preview import most_sensitive_joints, preview_sensitivity
from ._report import LinearityCheck, ParameterCheck, ReportEntry, SensitivityReport, build_report, check_linearity, resimulate
from ._sensitivity import PARAMETER_NAMES, Sensitivity, contact_point_names, sensitivity

__all__ = [
    "sensitivity",
    "Sensitivity",
    "SensitivityReport",
    "ReportEntry",
    "ParameterCheck",
    "LinearityCheck",
    "build_report",
    "check_linearity",
    "resimulate",
    "make_metric",
    "plot_sensitivity",
    "preview_sensitivity",
    "most_sensitive_joints",
    "contact_point_names",
    "load_trajectory",
    "save_trajectory",
    "METRICS",
    "PARAMETER_NAMES",
    "TRAJECTORY_KEYS",
]
