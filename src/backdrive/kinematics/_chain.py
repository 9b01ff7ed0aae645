"""A serial chain cut out of the whole-tree model: pose and Jacobians.

:class:`SerialChainKinematics` selects the bodies on the path from a root link
to an end link of a :class:`~backdrive.RobotModel`, folds every fixed offset
into per-joint constants once (in float64), and evaluates:

* the pose (:meth:`~SerialChainKinematics.forward_kinematics`, the IK's
  final pose) at every batch size on the tree's reference FK kernel
  (:func:`~backdrive.kinematics._fk.jump_compose`): pointer jumping
  restricted to the end of the path, which is the pairwise product tree over
  the joints, then the tool; from 32 samples its first round (the products
  of neighbouring joints) is one batched product straight from the joints'
  sines and cosines (:func:`~backdrive.kinematics._fk.jump_first`);
* the pose with the geometric Jacobian (``evaluate``, ``jacobian``, every IK
  iteration) in one serial pass that never builds a 4x4 product: each step
  is one GEMM against a constant ``3 x 11`` block, ``R_prev @ [Rpl, Rpl K,
  Rpl K^2, p_pl, Rpl a]``, then the Rodrigues mix with the joint's sine and
  cosine; the joint's world axis and origin (the Jacobian's columns) come
  out of the same GEMM. Its backward is closed-form (:class:`_JacobianPass`).

The Jacobian is ``[linear; angular]`` rows in the chain root frame at the
tool point.
"""

from __future__ import annotations

import hashlib
import numpy as np
import torch

from .._errors import InputError
from ..model import JointType, RobotModel
from ..model._model import check_device, dtype_mismatch
from ..runtime import finite_checked
from ._fk import jump_coefficients, jump_compose, jump_first, jump_layout, jump_locals, jump_pairs, jump_plan
from ._kernels import cross, skew

__all__ = ["SerialChainKinematics"]

def _inv_np(T: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = T[:3, :3].T
    out[:3, 3] = -T[:3, :3].T @ T[:3, 3]
    return out


class SerialChainKinematics:
    """Forward kinematics and Jacobians of the chain from a root link to an end link.

    The chain's coordinates are the independent joints that move it, in chain
    order (root to end). A mimic joint inside the chain is not a coordinate:
    it follows ``multiplier * q[leader] + offset``; if its leader lies outside
    the chain the leader still becomes a chain coordinate, because it moves
    the chain.

    Build with :meth:`from_urdf` or :meth:`from_model`. Instances are
    immutable; :meth:`to` returns a copy, re-cast from float64 constants, so a
    float32 -> float64 round trip is exact.

    Attributes:
        model: the whole-tree :class:`~backdrive.RobotModel` the chain was cut from.
        root_link_name, end_link_name: the chain's end frames.
        joint_names: chain coordinates, root to end.
        dof: number of chain coordinates.
        lower, upper: ``(dof,)`` physical position limits (``-inf``/``inf``
            when unbounded).
        fingerprint: SHA-256 hex digest of the chain geometry (joint names and
            types, mimic coupling and the folded placements, axes and end
            frame in canonical float64). Chains with equal fingerprints
            compute equal poses.
    """

    def __init__(self, model: RobotModel, *, end_link_name: str, root_link_name: str | None = None):
        if not isinstance(model, RobotModel):
            raise InputError(f"model must be a backdrive.RobotModel, got {type(model).__name__}")
        if model.floating_base:
            raise InputError(
                "a serial chain is fixed to its root link: load the model with floating_base=False"
            )
        if not isinstance(end_link_name, str):
            raise InputError(f"end_link_name must be a link name (str), got {end_link_name!r}")
        root_link_name = model.link_names[0] if root_link_name is None else root_link_name
        if not isinstance(root_link_name, str):
            raise InputError(f"root_link_name must be a link name (str) or None, got {root_link_name!r}")
        f_end = model.frame_index(end_link_name)
        f_root = model.frame_index(root_link_name)
        self.model = model
        self.root_link_name = root_link_name
        self.end_link_name = end_link_name
        self._master = _build_master(model.to(device="cpu", dtype=torch.float64), f_root, f_end)
        self.joint_names: tuple[str, ...] = self._master["joint_names"]
        self.dof = len(self.joint_names)
        self.fingerprint: str = self._master["fingerprint"]
        self._init_tensors(model.dtype, model.device)

    # ------------------------------------------------------------------ build

    @classmethod
    def from_urdf(
        cls,
        urdf,
        end_link_name: str,
        root_link_name: str | None = None,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> SerialChainKinematics:
        """Load a URDF and cut out the chain from ``root_link_name`` to ``end_link_name``.

        Args:
            urdf: URDF text, bytes or a path.
            end_link_name: the link whose frame is the chain's end (any link,
                fixed frames such as a TCP link included).
            root_link_name: the chain root; default the tree root. Must be an
                ancestor of the end link.
            device: torch device of the constants.
            dtype: ``torch.float32`` or ``torch.float64``.

        Raises:
            UnknownNameError: an unknown link name (lists the closest names).
            InputError: the root is not an ancestor of the end link, or no
                moving joint lies between them.
            ModelError: the URDF cannot be loaded.
        """
        model = RobotModel.from_urdf(urdf, dtype=dtype, device=device)
        return cls(model, end_link_name=end_link_name, root_link_name=root_link_name)

    @classmethod
    def from_model(
        cls, model: RobotModel, *, end_link_name: str, root_link_name: str | None = None
    ) -> SerialChainKinematics:
        """The chain of an already loaded (fixed-base) model, in its dtype and device."""
        return cls(model, end_link_name=end_link_name, root_link_name=root_link_name)

    def _init_tensors(self, dtype: torch.dtype, device: torch.device) -> None:
        m = self._master

        def t(a):
            return torch.from_numpy(np.array(a, dtype=np.float64)).to(dtype=dtype, device=device)

        self.dtype = dtype
        self.device = torch.device(device)
        self._tool_cache = None
        self.lower = t(m["lower"])
        self.upper = t(m["upper"])
        n = m["num_bodies"]
        self._n = n
        self._is_pri = tuple(bool(x) for x in m["is_prismatic"])
        self._any_pri = any(self._is_pri)
        self._identity_coupling = bool(m["identity_coupling"])
        self._coord = torch.from_numpy(np.array(m["coordinate"])).to(device)
        self._mult = t(m["multiplier"])
        self._offset = t(m["offset"])
        self._G = t(m["coupling"])  # (n, dof)
        blocks = t(m["blocks"])  # (n, 3, 11): [Rpl, Rpl K, Rpl K^2, p_pl, Rpl a]
        self._blocks_t = blocks.transpose(1, 2).contiguous()  # (n, 11, 3)
        # The first joint's parent is the chain root: its transposed block as
        # (11, 3, 1) rows, the layout of a GEMM output in :meth:`_serial`.
        self._first = blocks[0].T.contiguous()[:, :, None]
        # The pose runs on the tree's reference FK kernel (pointer
        # jumping, :func:`~._fk.jump_plan`) with the chain's own local
        # transforms, T_local(theta) = T_pl + sin A4 + (1 - cos) B4 + d C4,
        # restricted to the last joint (the pairwise product tree of the
        # path), times the tool.
        T_pl, A4, B4, C4 = (torch.from_numpy(np.array(m[k])) for k in ("T_pl", "A4", "B4", "C4"))
        loc64 = jump_coefficients(T_pl, A4, B4, C4 if self._any_pri else None)
        self._jump_locals = type(loc64)(*(x.to(dtype=dtype, device=device) for x in loc64))
        self._jump_plan = jump_plan(list(range(-1, n - 1)), [n - 1], device)
        # Its first round (the products of neighbouring joints) fused with the
        # local transforms, from the float64 constants (:func:`~._fk.jump_first`).
        pairs = jump_pairs(self._jump_plan, loc64, None, dtype)
        self._jump_pairs = None if pairs is None else type(pairs)(*(x.to(device) for x in pairs))
        self._bottom = t(np.array([[0.0], [0.0], [0.0], [1.0]]))[None]  # (1, 4, 1): a 4x4's bottom row, batch last
        self._end = t(m["end"])  # (4, 4) last body -> end frame
        self._rev_mask = t(1.0 - m["is_prismatic"])
        self._pri_mask = t(m["is_prismatic"])

    # ------------------------------------------------------------------ copies

    def to(self, device=None, dtype=None) -> SerialChainKinematics:
        """A copy on ``device`` in ``dtype`` (constants re-cast from float64)."""
        device = self.device if device is None else check_device(device)
        dtype = self.dtype if dtype is None else dtype
        if dtype not in (torch.float32, torch.float64):
            raise InputError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        new = object.__new__(type(self))
        new.model = self.model.to(device=device, dtype=dtype)
        new.root_link_name = self.root_link_name
        new.end_link_name = self.end_link_name
        new._master = self._master
        new.joint_names = self.joint_names
        new.dof = self.dof
        new.fingerprint = self.fingerprint
        new._init_tensors(dtype, device)
        return new

    def double(self) -> SerialChainKinematics:
        return self.to(dtype=torch.float64)

    def float(self) -> SerialChainKinematics:
        return self.to(dtype=torch.float32)

    def __repr__(self) -> str:
        return (
            f"SerialChainKinematics(robot={self.model.name!r}, root={self.root_link_name!r}, "
            f"end={self.end_link_name!r}, dof={self.dof}, dtype={self.dtype}, device={self.device})"
        )

    # ------------------------------------------------------------------ checks

    def check_q(self, q: torch.Tensor, name: str = "qpos") -> None:
        """Raise :class:`InputError` unless ``q`` is ``(..., dof)`` in this chain's dtype/device."""
        if not isinstance(q, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(q).__name__}")
        if q.ndim == 0 or q.shape[-1] != self.dof:
            raise InputError(
                f"{name} must have shape (..., {self.dof}) for the chain {self.joint_names}, "
                f"got {tuple(q.shape)}"
            )
        self._check_dd(q, name)

    def _check_dd(self, x: torch.Tensor, name: str) -> None:
        if x.dtype != self.dtype:
            raise dtype_mismatch(name, x.dtype, self.dtype, "the kinematics", "kinematics")
        if x.device != self.device:
            raise InputError(
                f"{name} is on {x.device} but the kinematics are on {self.device}; "
                f"move the input or the kinematics"
            )

    def _check_tcp(self, tcp: torch.Tensor | None) -> None:
        if tcp is None:
            return
        if not isinstance(tcp, torch.Tensor) or tcp.shape != (4, 4):
            shape = tuple(tcp.shape) if isinstance(tcp, torch.Tensor) else type(tcp).__name__
            raise InputError(f"tcp must be a (4, 4) tensor, got {shape}")
        self._check_dd(tcp, "tcp")

    # ------------------------------------------------------------------ kinematics

    @finite_checked(name="SerialChainKinematics.forward_kinematics")
    def forward_kinematics(self, qpos: torch.Tensor, tcp: torch.Tensor | None = None) -> torch.Tensor:
        """Pose of the end frame (times ``tcp``) in the chain root frame.

        Args:
            qpos: ``(..., dof)`` joint positions (rad, m), evaluated as given
                (no clipping to the limits).
            tcp: optional ``(4, 4)`` end-frame-from-tool transform.

        Returns:
            ``(..., 4, 4)`` poses ``T_root_tool``.
        """
        self.check_q(qpos)
        self._check_tcp(tcp)
        if qpos.ndim == 1:  # one sample: no batch bookkeeping (measured 20 us of 60)
            theta = qpos if self._identity_coupling else qpos[self._coord] * self._mult + self._offset
            return self._jump(theta[:, None], tcp)[0].view(4, 4)
        batch = qpos.shape[:-1]
        return self._pose(qpos.reshape(-1, self.dof), tcp).reshape(*batch, 4, 4)

    @finite_checked(name="SerialChainKinematics.evaluate")
    def evaluate(
        self, qpos: torch.Tensor, tcp: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tool poses and geometric Jacobians from one FK pass.

        The Jacobian maps joint rates to the tool twist ``[v; omega]``: ``v``
        is the velocity of the tool origin and ``omega`` the angular velocity,
        both expressed in the chain root frame. Column ``j`` of a revolute
        joint is ``[z_j x (p_tool - o_j); z_j]``, of a prismatic one
        ``[z_j; 0]``, with ``z_j``/``o_j`` the root-frame axis/origin of the
        joint; a mimic joint adds ``multiplier *`` its column to its leader's.
        Autograd differentiates through both outputs (the Jacobian's own
        derivatives included).

        Args:
            qpos: ``(..., dof)``.
            tcp: optional ``(4, 4)`` end-frame-from-tool transform.

        Returns:
            ``T_root_tool (..., 4, 4)`` and ``J (..., 6, dof)``.
        """
        self.check_q(qpos)
        self._check_tcp(tcp)
        batch = qpos.shape[:-1]
        q = qpos.reshape(-1, self.dof)
        RT, p, J = self.fast_pass(q.T.contiguous(), tcp)
        T = fast_to_homogeneous(RT, p).reshape(*batch, 4, 4)
        return T, J.permute(2, 0, 1).reshape(*batch, 6, self.dof)

    @finite_checked(name="SerialChainKinematics.jacobian")
    def jacobian(self, qpos: torch.Tensor, tcp: torch.Tensor | None = None) -> torch.Tensor:
        """Geometric Jacobian ``(..., 6, dof)`` of the tool point (see :meth:`evaluate`)."""
        return self.evaluate(qpos, tcp)[1]

    # ------------------------------------------------------------------ internals

    def _tool(self, tcp: torch.Tensor | None) -> torch.Tensor:
        """``T_end_tool = F_end @ tcp``; cached for a tcp that needs no gradient
        (keyed on the tensor object and its version counter, which every
        in-place change such as ``load_state_dict`` bumps)."""
        if tcp is None:
            return self._end
        if tcp.requires_grad:
            return self._end @ tcp
        cache = self._tool_cache
        if cache is not None and cache[0] is tcp and cache[1] == tcp._version:
            return cache[2]
        tool = self._end @ tcp
        self._tool_cache = (tcp, tcp._version, tool)
        return tool

    def _jump(self, theta: torch.Tensor, tcp: torch.Tensor | None):
        """The tool pose from body angles ``theta (n, N)`` on the tree's
        reference FK kernel (:func:`~._fk.jump_locals`: every local 4x4
        transform in one batched product; :func:`~._fk.jump_compose`: pointer
        jumping restricted to the last joint, which on a path is the pairwise
        product tree over the joints; then the tool). Returns the kernel's
        ``(1, ...)`` output and its layout (:func:`~._fk.jump_layout`)."""
        N = theta.shape[1]
        pri = self._any_pri
        layout = jump_layout(self._jump_plan, N)
        rev, is_pri = (self._rev_mask, self._pri_mask) if pri else (None, None)
        if layout != "first" and self._jump_pairs is not None:
            T = jump_first(self._jump_pairs, theta, rev, is_pri, layout)
            return jump_compose(T, self._jump_plan, layout, last=self._tool(tcp), start=1), layout
        T = jump_locals(self._jump_locals, theta, rev, is_pri, layout)
        return jump_compose(T, self._jump_plan, layout, last=self._tool(tcp)), layout

    def _pose(self, q: torch.Tensor, tcp: torch.Tensor | None) -> torch.Tensor:
        """Pose-only FK ``(N, 4, 4)`` of ``q (N, dof)`` (:meth:`_jump`)."""
        theta = q if self._identity_coupling else q[:, self._coord] * self._mult + self._offset
        N = theta.shape[0]
        # Batch last, the angles' rows contiguous: sin and cos of a transposed
        # view keep its strides and slow every later pass.
        T, layout = self._jump(theta.T if N < 2 else theta.T.contiguous(), tcp)
        T = T[0]
        if layout == "first":
            return T
        if layout == "affine":
            T = torch.cat([T, self._bottom.expand(1, 4, N)], 0)
        return T.permute(2, 0, 1)

    def pose_soa(self, qT: torch.Tensor, tcp: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Pose-only FK of ``qT (dof, M)`` in the layout of :meth:`fast_plain`:
        ``RT (3, 3, M)`` (transposed rotation), ``p (3, M)`` (:meth:`_jump`)."""
        theta = qT if self._identity_coupling else qT[self._coord] * self._mult[:, None] + self._offset[:, None]
        T, layout = self._jump(theta, tcp)
        T = T[0]
        if layout == "first":  # (M, 4, 4)
            return T[:, :3, :3].permute(2, 1, 0), T[:, :3, 3].T
        return T[:3, :3].transpose(0, 1), T[:3, 3]

    def fast_pass(self, qT: torch.Tensor, tcp: torch.Tensor | None):
        """Tool pose and Jacobian in a batch-last layout; see :meth:`fast_plain`.

        When a gradient is needed, a revolute-only chain uses
        :class:`_JacobianPass`, whose backward is the closed-form derivative
        of the pose and of the Jacobian (one sweep over the joints) instead of
        a recorded graph of the loop.
        """
        if (
            torch.is_grad_enabled()
            and qT.requires_grad
            and not self._any_pri
            and (tcp is None or not tcp.requires_grad)
        ):
            return _JacobianPass.apply(qT, self, tcp)
        return self.fast_plain(qT, tcp)

    def fast_plain(self, qT: torch.Tensor, tcp: torch.Tensor | None, *, internals: bool = False):
        """The chain's Jacobian pass: tool pose and geometric Jacobian in a
        batch-last ("structure of arrays") layout. (Pose-only queries take the
        reference FK kernel, :meth:`_jump`.)

        Rotations are kept transposed and batch-last, ``RT[c, r, :] = R[r, c]``,
        so that a step ``R_prev @ C`` for the constant ``3 x 11`` block ``C`` is
        one GEMM ``C^T @ RT_prev.view(3, 3 M)`` whose output rows are already
        the transposed blocks, and every elementwise mix runs over contiguous
        rows of ``M`` samples. (A batch of tiny ``bmm`` calls is an order of
        magnitude slower on CPUs.)

        Args:
            qT: ``(dof, M)`` joint positions, batch last (no checks).
            tcp: optional ``(4, 4)``.

        Returns:
            ``RT (3, 3, M)`` (the tool rotation, transposed), ``p (3, M)`` the
            tool position, and ``J (6, dof, M)``; with ``internals`` also the
            world axes ``Z (n, 3, M)`` and the linear Jacobian rows ``(n, 3,
            M)`` of every chain body.
        """
        if self._identity_coupling:
            theta = qT
        else:
            theta = qT[self._coord] * self._mult[:, None] + self._offset[:, None]
        M = theta.shape[1]
        ang = theta * self._rev_mask[:, None] if self._any_pri else theta
        s_rows = torch.sin(ang).unbind(0)
        omc_rows = (1.0 - torch.cos(ang)).unbind(0)
        th_rows = theta.unbind(0) if self._any_pri else None
        blocks = self._blocks_t  # (n, 11, 3)
        axes: list[torch.Tensor] = []
        origins: list[torch.Tensor] = []
        RT = p = None
        for i in range(self._n):
            if i == 0:
                X = self._first  # (11, 3, 1): the root is fixed
            else:
                X = (blocks[i] @ RT.reshape(3, 3 * M)).view(11, 3, M)
            R0, R1, R2, pp, ax = X.split((3, 3, 3, 1, 1), dim=0)
            if self._is_pri[i]:
                RT_new = R0.expand(3, 3, M)
                p_new = pp[0] + th_rows[i] * ax[0]
            else:
                RT_new = torch.addcmul(torch.addcmul(R0, s_rows[i], R1), omc_rows[i], R2)
                p_new = pp[0]
            p_new = p_new.expand(3, M) if p is None else p_new + p
            axes.append(ax[0].expand(3, M))
            origins.append(p_new)
            RT, p = RT_new, p_new
        Xt = (self._tool(tcp)[:3, :].T @ RT.reshape(3, 3 * M)).view(4, 3, M)
        RT_tool, pt = Xt.split((3, 1), dim=0)
        p_tool = pt[0] + p  # (3, M)
        Z = torch.stack(axes, dim=0)  # (n, 3, M)
        r = p_tool[None] - torch.stack(origins, dim=0)
        # z x r by components: linalg.cross over a middle axis is several
        # times slower than these nine row operations.
        z0, z1, z2 = Z.unbind(1)
        r0, r1, r2 = r.unbind(1)
        lin = torch.stack([z1 * r2 - z2 * r1, z2 * r0 - z0 * r2, z0 * r1 - z1 * r0], dim=1)
        if self._any_pri:
            lin = torch.where(self._pri_mask[:, None, None] > 0, Z, lin)
            Z = Z * self._rev_mask[:, None, None]
        J = torch.cat([lin, Z], dim=1).transpose(0, 1)  # (6, n, M)
        if not self._identity_coupling:
            J = torch.einsum("anm,nd->adm", J, self._G)
        if internals:
            return RT_tool, p_tool, J, Z, lin
        return RT_tool, p_tool, J


class _JacobianPass(torch.autograd.Function):
    """Tool pose and Jacobian of a revolute chain with a closed-form backward.

    With ``z_i``/``o_i`` the root-frame axis/origin of body ``i``, ``p``/``R``
    the tool position/rotation and ``v_i = z_i x (p - o_i)`` the linear
    Jacobian column, the derivatives with respect to body angle ``t_j`` are
    ``dR = [z_j]x R``, ``dp = v_j``, ``dz_i = z_j x z_i`` and
    ``dv_i = z_j x v_i`` for ``j < i``, ``dv_i = z_i x v_j`` for ``j >= i``
    (``dz_i = 0`` there). For output gradients ``G_R, G_p, G_v, G_z`` this
    gives, with ``a = vee2(G_R R^T)`` (``<G_R, [z]x R> = z . a``)::

        dL/dt_j = z_j . (a + sum_{i>j} (v_i x G_v_i + z_i x G_z_i))
                + v_j . (G_p + sum_{i<=j} G_v_i x z_i),

    one prefix and one suffix sum over the joints; mimic coupling maps body
    angles to coordinates. A double backward (``create_graph``) falls back to
    differentiating :meth:`SerialChainKinematics.fast_plain` with autograd.
    Checked against it by ``gradcheck`` in the tests.
    """

    @staticmethod
    def forward(ctx, qT, chain, tcp):
        RT, p, J, Z, V = chain.fast_plain(qT, tcp, internals=True)
        ctx.chain = chain
        ctx.tcp = tcp
        ctx.save_for_backward(qT, RT, Z, V)
        return RT, p, J

    @staticmethod
    def backward(ctx, g_RT, g_p, g_J):
        qT, RT, Z, V = ctx.saved_tensors
        chain = ctx.chain
        if torch.is_grad_enabled():  # create_graph: plain autograd, differentiable again
            with torch.enable_grad():
                outs = chain.fast_plain(qT, ctx.tcp)
            (g,) = torch.autograd.grad(outs, qT, (g_RT, g_p, g_J), create_graph=True)
            return g, None, None
        if not chain._identity_coupling:
            g_J = torch.einsum("adm,nd->anm", g_J, chain._G)
        g_V = g_J[:3].transpose(0, 1)  # (n, 3, M)
        g_Z = g_J[3:].transpose(0, 1)
        # X = G_R R^T with G_R[r, c] = g_RT[c, r] and R[k, c] = RT[c, k].
        X = (g_RT[:, :, None, :] * RT[:, None, :, :]).sum(0)  # (3 r, 3 k, M)
        a = torch.stack([X[2, 1] - X[1, 2], X[0, 2] - X[2, 0], X[1, 0] - X[0, 1]], dim=0)
        terms = (cross(V, g_V, 1) + cross(Z, g_Z, 1)).unbind(0)  # n x (3, M)
        pre_terms = cross(g_V, Z, 1).unbind(0)
        n = len(terms)
        # Suffix sums (i > j) and prefix sums (i <= j) over the joints as row
        # additions (cumsum over a leading axis is several times slower).
        suffix = [a] * n
        for j in range(n - 2, -1, -1):
            suffix[j] = suffix[j + 1] + terms[j + 1]
        prefix = [g_p + pre_terms[0]]
        for j in range(1, n):
            prefix.append(prefix[-1] + pre_terms[j])
        g_theta = (Z * torch.stack(suffix, 0)).sum(1) + (V * torch.stack(prefix, 0)).sum(1)  # (n, M)
        if not chain._identity_coupling:
            g_theta = torch.einsum("nd,nm->dm", chain._G, g_theta)
        return g_theta, None, None


def fast_to_homogeneous(RT: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``(M, 4, 4)`` poses from a transposed batch-last rotation ``RT (3, 3, M)``
    and position ``p (3, M)``."""
    M = p.shape[1]
    bottom = torch.zeros(4, M, dtype=p.dtype, device=p.device)
    bottom[3] = 1.0
    top = torch.cat([RT, p[None]], dim=0)  # (column c = 4, row r = 3, M)
    T = torch.cat([top, bottom[:, None, :]], dim=1)  # (c, r, M)
    return T.permute(2, 1, 0)


def _build_master(model: RobotModel, f_root: int, f_end: int) -> dict:
    """Float64 numpy constants of the chain (model given in float64 on the CPU)."""
    parent = model.parent.tolist()
    b_root = int(model.frame_body[f_root])
    b_end = int(model.frame_body[f_end])
    path: list[int] = []
    b = b_end
    while b != b_root:
        if b <= 0:
            raise InputError(
                f"link {model.link_names[f_root]!r} is not an ancestor of link "
                f"{model.link_names[f_end]!r}: a serial chain runs from a root link down the "
                f"tree to its end link"
            )
        path.append(b)
        b = parent[b]
    path.reverse()
    if not path:
        raise InputError(
            f"no moving joint lies between links {model.link_names[f_root]!r} and "
            f"{model.link_names[f_end]!r}; a kinematic chain needs at least one"
        )
    n = len(path)
    placement = model.joint_placement.numpy()
    axis_all = model.joint_axis.numpy()
    F_root = model.frame_placement[f_root].numpy()
    F_end = model.frame_placement[f_end].numpy()

    # Chain coordinates: the independent coordinates that drive chain bodies,
    # in order of first appearance along the chain.
    coords_global = [int(model.joint_coordinate[b]) for b in path]
    order: list[int] = []
    for c in coords_global:
        if c not in order:
            order.append(c)
    local = np.array([order.index(c) for c in coords_global], dtype=np.int64)
    mult = np.array([float(model.joint_multiplier[b]) for b in path])
    off = np.array([float(model.joint_offset[b]) for b in path])
    dof = len(order)
    G = np.zeros((n, dof))
    for i in range(n):
        G[i, local[i]] += mult[i]
    identity = n == dof and bool(np.all(local == np.arange(n))) and bool(np.all(mult == 1.0)) and bool(
        np.all(off == 0.0)
    )
    is_pri = np.array([model.joint_type[b] == JointType.PRISMATIC for b in path], dtype=np.float64)

    blocks = np.zeros((n, 3, 11))
    T_pl = np.zeros((n, 4, 4))
    A4 = np.zeros((n, 4, 4))
    B4 = np.zeros((n, 4, 4))
    C4 = np.zeros((n, 4, 4))
    axes = np.zeros((n, 3))
    for i, b in enumerate(path):
        P = placement[b].copy()
        if i == 0:
            P = _inv_np(F_root) @ P
        a = axis_all[b]
        axes[i] = a
        K = skew(torch.from_numpy(np.asarray(a, dtype=np.float64))).numpy()
        Rp, pp = P[:3, :3], P[:3, 3]
        blocks[i, :, 0:3] = Rp
        blocks[i, :, 3:6] = Rp @ K
        blocks[i, :, 6:9] = Rp @ K @ K
        blocks[i, :, 9] = pp
        blocks[i, :, 10] = Rp @ a
        T_pl[i] = P
        if is_pri[i]:
            C4[i, :3, 3] = Rp @ a
        else:
            A4[i, :3, :3] = Rp @ K
            B4[i, :3, :3] = Rp @ K @ K

    lower = model.lower.numpy()[order]
    upper = model.upper.numpy()[order]
    joint_names = tuple(model.joint_names[c] for c in order)

    h = hashlib.sha256()
    h.update(repr((joint_names, tuple(int(x) for x in is_pri))).encode())
    for arr in (local, mult, off, T_pl, axes, F_end):
        arr = np.ascontiguousarray(arr)
        h.update(arr.astype("<i8" if arr.dtype.kind == "i" else "<f8").tobytes())

    master = {
        "num_bodies": n,
        "joint_names": joint_names,
        "is_prismatic": is_pri,
        "coordinate": local,
        "multiplier": mult,
        "offset": off,
        "coupling": G,
        "identity_coupling": identity,
        "blocks": blocks,
        "T_pl": T_pl,
        "A4": A4,
        "B4": B4,
        "C4": C4,
        "end": F_end.copy(),
        "lower": lower.copy(),
        "upper": upper.copy(),
        "fingerprint": h.hexdigest(),
    }
    for v in master.values():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)
    return master
