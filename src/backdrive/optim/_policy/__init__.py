"""Policy learning through a differentiable environment: APG and SHAC.

Both algorithms roll the policy out for a short window of ``horizon`` steps in
every copy of a :class:`~backdrive.envs.DiffEnv`, backpropagate the window's
return through the simulator into the policy parameters, take one Adam step,
and cut the graph (``env.detach()``) before the next window. Episodes carry
on across windows, so after a few windows the states cover whole episodes.

- ``"apg"`` (analytic policy gradient): short-horizon backpropagation through
  time of the discounted window return, with gradient-norm clipping.
- ``"shac"`` (short-horizon actor-critic, Xu et al. 2022, "Accelerated Policy
  Learning with Parallel Differentiable Simulation"): the same window return
  plus a learned value of the state where the window or the episode ends, so
  the actor sees past the window; the critic regresses TD(lambda) targets
  computed from the window with a slowly moving target critic.

Data reuse (SHAC, off by default): ``critic_replay`` keeps past windows for
the critic, ``critic_batch_size`` turns its fit into many random-minibatch
steps, and ``actor_replay_steps`` adds actor steps on replayed transitions
through the action Jacobians recorded with them (SVG(1)-style). None of them
calls the simulator: ``env_steps`` counts the windows' transitions only.

One job per module, as in Brax's ``training/agents``:

- :mod:`.networks`: observation normaliser, MLP policy, value critic;
- :mod:`.config`: :class:`PolicyTrainerConfig`, the settings, validated when built;
- :mod:`.returns`: the window objective, TD(lambda) targets, :func:`evaluate_policy`;
- :mod:`.trainer`: :class:`PolicyTrainer` (the loop) and :func:`train_policy`;
- :mod:`.checkpoints`: checkpoints as tensors and plain containers, read
  with ``weights_only=True``, and :func:`load_policy`;
- :mod:`.presets`: :class:`Preset` objects with tuned settings per env.
"""

from ..._errors import PolicyConfigError, TrainingDivergedError
from .checkpoints import load_policy
from .config import ALGOS, PolicyTrainerConfig
from .networks import MLPPolicy, ObsNormalizer, ValueCritic
from .presets import HUMANOID_BALANCE_SHAC, HUMANOID_CAPTURE_SHAC  # noqa: F401 (HumanoidBalance blocks)
from .presets import GO1_WALK_SHAC, GO1_WALK_SHAC_SLIP  # noqa: F401 (the Go1 blocks)
from .presets import GO1_WALK_SHAC_LONG, QUADRUPED_WALK_SHAC_DECAY, QUADRUPED_WALK_SHAC_DECAY_DR, QUADRUPED_WALK_SHAC_FEW  # noqa: F401 (appended blocks)
from .presets import CARTPOLE_SHAC, PANDA_REACH_APG, PENDULUM_APG, PENDULUM_SHAC, PRESETS, QUADRUPED_WALK_SHAC, Preset
from .returns import evaluate_policy
from .trainer import PolicyTrainer, train_policy

__all__ = [
    "ALGOS",
    "Preset",
    "PRESETS",
    "PENDULUM_SHAC",
    "PENDULUM_APG",
    "CARTPOLE_SHAC",
    "PANDA_REACH_APG",
    "QUADRUPED_WALK_SHAC",
    "HUMANOID_BALANCE_SHAC",
    "HUMANOID_CAPTURE_SHAC",
    "GO1_WALK_SHAC",
    "GO1_WALK_SHAC_SLIP",
    "QUADRUPED_WALK_SHAC_FEW",
    "QUADRUPED_WALK_SHAC_DECAY",
    "QUADRUPED_WALK_SHAC_DECAY_DR",
    "GO1_WALK_SHAC_LONG",
    "PolicyTrainerConfig",
    "PolicyConfigError",
    "TrainingDivergedError",
    "ObsNormalizer",
    "MLPPolicy",
    "ValueCritic",
    "PolicyTrainer",
    "train_policy",
    "evaluate_policy",
    "load_policy",
]
