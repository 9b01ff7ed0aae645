"""Trajectory optimisation and system identification by back-propagation.

* :func:`optimize_trajectory`: open-loop controls through the simulator, with
  Adam, L-BFGS (strong-Wolfe line search) or Gauss-Newton (Levenberg-Marquardt).
* :func:`minimize` with one :class:`SolverOptions`: the solvers themselves,
  shared by trajectory optimisation and system identification.
* :func:`train_policy`: neural-network policies by back-propagation through a
  differentiable environment (APG, SHAC), in one process or data-parallel
  under ``torchrun`` (:func:`local_device`, :func:`rank_seed`; docs/scaling.md).
* :func:`identify`: masses, centres of mass, inertias, damping, friction and
  armature from recorded motion, through inverse dynamics
  (:class:`InverseDynamicsFit`) or the simulator (:class:`SimulationFit`), in
  a parametrisation that keeps them physically valid, with confidence
  intervals and the parameters the data do not determine; through the
  contact simulator (:class:`ContactFit`) also the contact law, motor
  strength, PD gains and control delay, on encoder and IMU channels.
"""

from ._costs import frame_position_error, joint_limit_violation, residual_vector
from ._demos import (
    CartpoleSwingup,
    MassSpringDamperDemo,
    PandaReach,
    cartpole_swingup,
    demo_mass_spring_damper,
    mass_spring_damper_problem,
    panda_min_torque_reach,
)
from ._policy import (
    ALGOS,
    CARTPOLE_SHAC,
    PANDA_REACH_APG,
    PENDULUM_APG,
    PENDULUM_SHAC,
    PRESETS,
    QUADRUPED_WALK_SHAC,
    QUADRUPED_WALK_SHAC_DECAY,
    QUADRUPED_WALK_SHAC_DECAY_DR,
    GO1_WALK_SHAC_LONG,
    QUADRUPED_WALK_SHAC_FEW,
    HUMANOID_BALANCE_SHAC,
    HUMANOID_CAPTURE_SHAC,
    GO1_WALK_SHAC,
    GO1_WALK_SHAC_SLIP,
    MLPPolicy,
    ObsNormalizer,
    PolicyConfigError,
    PolicyTrainer,
    PolicyTrainerConfig,
    Preset,
    TrainingDivergedError,
    ValueCritic,
    evaluate_policy,
    load_policy,
    train_policy,
)
from ._policy.distributed import local_device, rank_seed
from ._progress import ProgressBar
from ._smoothing import smooth_states
from ._solvers import (
    DEFAULT_ITERATIONS,
    BlockJacobian,
    OPTIMIZERS,
    SolverOptions,
    SolverResult,
    adam,
    jacobian,
    lbfgs,
    levenberg_marquardt,
    minimize,
)
from . import _sysid
from ._sysid import (
    CONTACT_PARAMETERS,
    DEFAULT_NOISE,
    SENSOR_CHANNELS,
    IDENTIFIABLE_PARAMETERS,
    ContactFit,
    IdentificationResult,
    InverseDynamicsFit,
    SimulationFit,
    cholesky_from_inertia,
    identify,
    inertia_from_cholesky,
    physically_consistent,
)
from ._trajopt import TrajectoryOptimizationResult, optimize_trajectory

__all__ = [
    "train_policy",
    "evaluate_policy",
    "load_policy",
    "PolicyTrainer",
    "PolicyTrainerConfig",
    "MLPPolicy",
    "ValueCritic",
    "ObsNormalizer",
    "ALGOS",
    "Preset",
    "PRESETS",
    "PENDULUM_SHAC",
    "PENDULUM_APG",
    "CARTPOLE_SHAC",
    "PANDA_REACH_APG",
    "QUADRUPED_WALK_SHAC",
    "QUADRUPED_WALK_SHAC_FEW",
    "QUADRUPED_WALK_SHAC_DECAY",
    "QUADRUPED_WALK_SHAC_DECAY_DR",
    "GO1_WALK_SHAC_LONG",
    "HUMANOID_BALANCE_SHAC",
    "HUMANOID_CAPTURE_SHAC",
    "GO1_WALK_SHAC",
    "GO1_WALK_SHAC_SLIP",
    "PolicyConfigError",
    "TrainingDivergedError",
    "local_device",
    "rank_seed",
    "optimize_trajectory",
    "TrajectoryOptimizationResult",
    "OPTIMIZERS",
    *_sysid.__all__,  # identify, its fits and results, the inertia parametrisation
    "smooth_states",
    "minimize",
    "SolverOptions",
    "DEFAULT_ITERATIONS",
    "adam",
    "lbfgs",
    "levenberg_marquardt",
    "jacobian",
    "BlockJacobian",
    "SolverResult",
    "ProgressBar",
    "mass_spring_damper_problem",
    "demo_mass_spring_damper",
    "MassSpringDamperDemo",
    "cartpole_swingup",
    "CartpoleSwingup",
    "panda_min_torque_reach",
    "PandaReach",
    "frame_position_error",
    "joint_limit_violation",
    "residual_vector",
]
