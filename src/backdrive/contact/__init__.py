"""Contact with friction: geometry on links, terrain, a smooth force law.

``ContactModel(robot, geometry, terrain, params).forces(robot, q, v)`` gives
per contact point the position, normal, penetration, normal and slip
velocity, normal and friction forces, and the body wrenches ``f_ext`` that
:func:`backdrive.dynamics.forward_dynamics` takes. ``acceleration`` adds the
dynamics, explicitly or with the contact damping and stiffness treated
implicitly. ``Scene`` steps a robot together with free objects
(``free_body``) that it pushes. ``SoftContactParameters`` swaps the penalty
law for MuJoCo's soft-constraint contact, solved per step. Every parameter is
a tensor that may require grad. See ``docs/contact.md`` for the equations,
the parameter guide and the validation.
"""

from ._geometry import MESH_RULES, SHAPE_KINDS, ContactApproximationWarning, ContactGeometry, ContactShape
from ._law import DEFAULT_CONTACT, ContactParameters, contact_law, restitution
from ._model import CONTACT_SCHEMES, ContactModel, ContactResult, ImplicitContact, stack_results
from ._pairs import BOX_MODES, SelfCollision, closest_points_segments
from ._soft import SoftContactParameters
from ._scene import OBJECT_KINDS, PairResult, Scene, SceneResult, free_body
from ._step import contact_step, integrate_world
from ._terrain import GroundPlane, Heightfield, Terrain

__all__ = [
    "ContactModel",
    "ContactResult",
    "ImplicitContact",
    "ContactGeometry",
    "ContactShape",
    "ContactParameters",
    "SoftContactParameters",
    "SelfCollision",
    "Scene",
    "SceneResult",
    "PairResult",
    "free_body",
    "OBJECT_KINDS",
    "BOX_MODES",
    "closest_points_segments",
    "ContactApproximationWarning",
    "GroundPlane",
    "Heightfield",
    "Terrain",
    "contact_step",
    "stack_results",
    "integrate_world",
    "contact_law",
    "restitution",
    "DEFAULT_CONTACT",
    "CONTACT_SCHEMES",
    "SHAPE_KINDS",
    "MESH_RULES",
]
