"""Browser previews and plots.

``preview`` writes one self-contained HTML file (viser's web client with the
recorded scene inside) that plays a robot trajectory offline, with a timeline;
``preview`` can also draw
contact points, force arrows and the terrain of a contact rollout;
``LiveViewer`` serves a scene on 127.0.0.1 that a running script moves;
``plot_*`` save PNGs with matplotlib. viser, trimesh and matplotlib come with
the ``[viz]`` extra and are imported only when a function needs them, so
``import backdrive.viz`` works without them.
"""

from ._browser import BrowserNotFoundError, find_chromium, screenshot, screenshots
from ._deps import MissingExtraError
from ._live import LiveViewer
from ._plots import plot_contact_forces, plot_ik_errors, plot_joint_trajectories, plot_losses, plot_parameters
from ._preview import preview
from ._scene import default_package_dirs, resolve_mesh_path

__all__ = [
    "preview",
    "LiveViewer",
    "plot_losses",
    "plot_joint_trajectories",
    "plot_ik_errors",
    "plot_parameters",
    "plot_contact_forces",
    "screenshot",
    "screenshots",
    "find_chromium",
    "resolve_mesh_path",
    "default_package_dirs",
    "MissingExtraError",
    "BrowserNotFoundError",
]
