"""Rigid-body dynamics on the whole tree, batched, differentiable.

Inverse dynamics (RNEA), the mass matrix (CRBA), forward dynamics (CRBA with
a Cholesky or tree-sparse factorisation, or ABA), energies, centre of mass,
joint damping and friction, and integration on the configuration manifold.
Fixed and floating base, revolute, continuous, prismatic and mimic joints.
Every function takes the robot first and tensors with leading batch axes
that broadcast; see ``docs/dynamics.md`` for the conventions and the
comparison with Pinocchio.

**Two paths.** Each algorithm has at most two implementations:

* the *reference* path, batch-first ``(..., k, 6)`` and plain autograd
  (``_tree.kinematics``, ``_rnea.rnea_core``, ``_crba.crba_core``,
  ``_aba.aba_core``, the energies). It serves small batches, ``torch.func``
  transforms, forward-mode AD and double backward, and the tests hold the
  fast path against it;
* the *fast* path (``_fast.py``), batch-last: the batch flattened and moved
  innermost, every vector held component by component, bodies in the tree's
  level order; a tree-sparse ``L^T D L`` factorisation of the mass matrix
  and a hand-written reverse pass of RNEA for the gradient of forward
  dynamics; ABA without a gradient (``aba_fast``); the energies and the
  centre of mass (``kinetic_energy_fast``, ``first_moment_fast``). Inside
  :class:`backdrive.runtime.reuse_workspaces` (opened by the simulator and
  the trainers) its large arrays are reused from call to call.

**One dispatch.** Each public function decides once, at its top, with
:func:`backdrive.kinematics._paths.choose` (batch size against
``FAST_MIN_BATCH``, the only thresholds; the reference under ``torch.func``);
:func:`use_path` forces one path for tests and benchmarks.

**One schedule.** Both paths walk the same per-model tree schedule
(``backdrive.kinematics._schedule``: the depth levels in body and level
order) with the same two primitives, ``down`` (sum over ancestors:
velocities, accelerations) and ``up`` (sum over the subtree: forces,
composite inertias), and share one module of small kernels
(``backdrive.kinematics._kernels``: skew matrices, cross products, inertia
products).

**Each algorithm, its two implementations** (reference; fast), audited
across ``src/`` with ``backdrive.contact`` and ``backdrive.sim`` included:

* forward kinematics of the tree: ``kinematics._fk.body_transforms_reference``;
  ``body_transforms_fast`` (backward ``fk_vjp_fast``);
* point and frame Jacobians: ``kinematics._fk.point_jacobians`` (behind
  ``frame_jacobian`` and the contact points of ``ContactModel.forces``);
  the contact fast step's columns from ``_fast.motion_subspace_fast``
  (``contact._fast.implicit_acceleration_fast``);
* world poses, motion subspaces and world inertias: ``_tree.kinematics``;
  ``_fast.kinematics_fast`` (``motion_subspace_fast``, ``world_inertia_fast``);
* RNEA: ``_rnea.rnea_core``; ``_fast.rnea_fast`` (reverse pass ``rnea_vjp_fast``);
* CRBA: ``_crba.crba_core``; ``_fast._composite_forces`` assembled as packed
  tree-sparse entries (``crba_entries_fast``) or, with mimic joints, dense
  (``dense_mass_matrix_fast``);
* the solve: batched Cholesky (``_forward._plain_crba``, the contact step's
  ``contact._model.spd_solve``); ``_fast.LTDLFactor`` (``DenseFactor`` with
  mimic joints);
* ABA: ``_aba.aba_core`` (also the gradient); ``_fast.aba_fast`` (no gradient);
* energies and centre of mass: ``_energy.kinetic_energy``,
  ``potential_energy``, ``center_of_mass``; ``_fast.kinetic_energy_fast``,
  ``first_moment_fast``;
* the implicit contact step: ``ContactModel.implicit_terms``;
  ``contact._fast.implicit_acceleration_fast``.

Written once and shared: the tree schedule and its sums
(``kinematics._schedule``), the joint coupling matrix
(``kinematics._fk.coupling_matrix``), the skew, cross and inertia kernels of
both layouts (``kinematics._kernels``), quaternions and the SO(3) log
(``backdrive.spatial``; ``so3_log_parts(batch_last=True)`` for the IK's
batch-last layout). The serial chain (``SerialChainKinematics``) computes its pose at every
batch size on the tree's reference FK kernel (``kinematics._fk.jump_first``,
``jump_compose``, restricted to its path), and keeps its own pass for the
pose with the Jacobian (``fast_pass``, ``_JacobianPass``), never a pose-only
path: forward kinematics has one reference and one batch-last
implementation (see ``docs/kinematics.md``, "One reference FK").

Following :func:`forward_dynamics`: ``_forward._forward_dynamics`` checks and
broadcasts the inputs and adds the joints' damping and friction (when some
are non-zero), then branches once. Reference: ``_plain_crba`` (``kinematics``
-> ``crba_core`` and ``rnea_core`` -> Cholesky solve). Fast:
``_fast.forward_fast`` (``kinematics_fast`` -> ``rnea_fast`` ->
``crba_entries_fast`` -> ``LTDLFactor``, whose factorisation also does the
first solve's forward substitution; without a gradient in the floating
base's frame, ``_to_base_frame``), wrapped in ``_ForwardDynamics`` when a
gradient is needed (backward: ``M^-1 g`` with the same factor,
``LTDLFactor.solve_fast``, then ``rnea_vjp_fast``).
"""

from ._compiled import CompilerUnavailableError, compile_forward_dynamics
from ._configuration import difference, integrate
from ._crba import mass_matrix
from ._energy import center_of_mass, kinetic_energy, potential_energy
from ._forward import DEFAULT_FRICTION_WIDTH, FORWARD_METHODS, forward_dynamics, joint_forces
from ._rnea import bias_forces, gravity_forces, inverse_dynamics
from ..kinematics._paths import use_path
from ..runtime import finite_checked

# Checked for NaN/inf under backdrive.runtime.check_finite() (one thread-local read otherwise).
inverse_dynamics = finite_checked(inverse_dynamics, name="inverse_dynamics")
mass_matrix = finite_checked(mass_matrix, name="mass_matrix")
bias_forces = finite_checked(bias_forces, name="bias_forces")
gravity_forces = finite_checked(gravity_forces, name="gravity_forces")
forward_dynamics = finite_checked(forward_dynamics, name="forward_dynamics")
joint_forces = finite_checked(joint_forces, name="joint_forces")
kinetic_energy = finite_checked(kinetic_energy, name="kinetic_energy")
potential_energy = finite_checked(potential_energy, name="potential_energy")
center_of_mass = finite_checked(center_of_mass, name="center_of_mass")
integrate = finite_checked(integrate, name="integrate")
difference = finite_checked(difference, name="difference")

__all__ = [
    "inverse_dynamics",
    "mass_matrix",
    "bias_forces",
    "gravity_forces",
    "forward_dynamics",
    "joint_forces",
    "kinetic_energy",
    "potential_energy",
    "center_of_mass",
    "integrate",
    "difference",
    "DEFAULT_FRICTION_WIDTH",
    "FORWARD_METHODS",
    "compile_forward_dynamics",
    "CompilerUnavailableError",
    "use_path",
]
