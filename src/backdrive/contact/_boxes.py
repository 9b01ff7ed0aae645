"""Exact contact rows between boxes, spheres and capsules (world frame).

Every function takes world poses (batch axes ``...`` broadcast) and returns
contact *rows*: the point where the force acts ``(..., r, 3)``, the unit
normal ``(..., r, 3)`` pointing from the second shape into the first (the
force on the first shape acts along ``+normal``) and the penetration
``(..., r)`` (m, positive when the shapes overlap). A row that cannot touch
gets the penetration :data:`INACTIVE` (so the force law gives exactly zero
force) and a finite normal.

Rows per pair:

- sphere-box: 1 (the exact signed distance of the centre to the box);
- capsule-box: 3 (each end cap as a sphere, and the axis against the box
  edge it crosses, for a capsule lying across an edge);
- box-box: 25 (each box's 8 corners against the other box, the crossings
  of the edges of the two faces that face each other, and for separated
  boxes one edge-edge row from the separating-axis test).

Where the contact set switches, and why (see ``docs/contact.md``): a point
inside a box is pushed out through its *nearest* face, so its normal jumps
where two faces are equally near (half-way into the box); the capsule's
crossing row exists only while the point of its axis nearest a box edge lies
strictly inside the axis (the end caps take over at the ends); an edge
crossing is sought between the edges of the two faces that face each other
along the least-overlapping face axis (the faces switch with that axis),
and exists while both closest points are strictly inside their edges and
inside the other box (or outside by a tenth of its depth); the separated boxes' edge row exists
only while an edge-edge axis separates the boxes most of the 15 axes of the
separating-axis test (Gottschalk, Lin and Manocha, *OBBTree*, 1996;
Ericson, *Real-Time Collision Detection*, 4.4.1), with a margin favouring
the face axes so that aligned stacks never switch on rounding. Away from
these sets every row is smooth in the poses.
"""

from __future__ import annotations

import torch


__all__ = ["INACTIVE", "BOX_BOX_ROWS", "EDGE_CROSSINGS", "closest_points_segments", "box_signed_distance", "sphere_box_rows", "capsule_box_rows", "box_box_rows"]

#: Penetration given to rows that cannot touch, m (the force law's
#: softplus is then 0 to machine precision for any normal width below 1 cm).
INACTIVE = -1.0

_CORNERS = torch.tensor([[sx, sy, sz] for sx in (-1.0, 1.0) for sy in (-1.0, 1.0) for sz in (-1.0, 1.0)])


def closest_points_segments(p1, q1, p2, q2):
    """Closest points of segments ``[p1, q1]`` and ``[p2, q2]`` (``(..., 3)`` each).

    The clamped solution of Ericson's *Real-Time Collision Detection* (5.1.9),
    written with ``torch.where`` on safe denominators so that degenerate
    segments (points) and parallel segments keep finite values and gradients.

    Returns:
        ``c1 (..., 3)`` on the first segment and ``c2 (..., 3)`` on the second.
    """
    d1, d2, r = q1 - p1, q2 - p2, p1 - p2
    a = (d1 * d1).sum(-1)
    e = (d2 * d2).sum(-1)
    f = (d2 * r).sum(-1)
    c = (d1 * r).sum(-1)
    b = (d1 * d2).sum(-1)
    tiny = torch.finfo(a.dtype).eps
    one = torch.ones_like(a)
    a_ok, e_ok = a > tiny, e > tiny
    a_s = torch.where(a_ok, a, one)
    e_s = torch.where(e_ok, e, one)
    denom = a * e - b * b
    den_ok = denom > tiny * torch.clamp_min(a * e, tiny)
    den_s = torch.where(den_ok, denom, one)
    s = torch.where(den_ok, ((b * f - c * e) / den_s).clamp(0.0, 1.0), torch.zeros_like(a))
    t = (b * s + f) / e_s
    s_lo = (-c / a_s).clamp(0.0, 1.0)
    s_hi = ((b - c) / a_s).clamp(0.0, 1.0)
    s = torch.where(t < 0, s_lo, torch.where(t > 1, s_hi, s))
    t = t.clamp(0.0, 1.0)
    # Degenerate segments: a point against a segment (either way), or two points.
    both = a_ok & e_ok
    zero = torch.zeros_like(a)
    s = torch.where(both, s, torch.where(a_ok, s_lo, zero))
    t = torch.where(both, t, torch.where(e_ok, (f / e_s).clamp(0.0, 1.0), zero))
    return p1 + s[..., None] * d1, p2 + t[..., None] * d2


def _edges() -> torch.Tensor:
    """``(12, 2, 3)`` end-point sign patterns of a box's edges (times the half extents)."""
    out = []
    for i in range(3):
        j, k = [a for a in range(3) if a != i]
        for sj in (-1.0, 1.0):
            for sk in (-1.0, 1.0):
                e = torch.zeros(2, 3)
                e[:, j], e[:, k] = sj, sk
                e[0, i], e[1, i] = -1.0, 1.0
                out.append(e)
    return torch.stack(out)


_EDGES = _edges()


def box_signed_distance(x: torch.Tensor, half: torch.Tensor):
    """Signed distance of points to a box centred at the origin, in the box frame.

    Outside: the Euclidean distance to the box (smooth across edge and corner
    regions). Inside: minus the distance to the nearest face (the normal is
    that face's; it switches where two faces are equally near).

    Args:
        x: ``(..., 3)`` points in the box frame, m.
        half: ``(..., 3)`` half extents, m.

    Returns:
        ``sd (...)`` m, ``n (..., 3)`` outward unit normal (gradient of ``sd``)
        and ``surface (..., 3)`` the nearest surface point ``x - sd n``, all
        in the box frame.
    """
    sign = torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))
    q = x.abs() - half
    qo = q.clamp_min(0.0)
    no2 = (qo * qo).sum(-1)
    outside = no2 > 0
    # The norm and its gradient only where it is positive (torch.where
    # back-propagates through the branch not taken, so that branch is kept finite).
    no = torch.sqrt(torch.where(outside, no2, torch.ones_like(no2)))
    qmax, k = q.max(-1)
    face = torch.nn.functional.one_hot(k, 3).to(x.dtype) * sign
    n = torch.where(outside[..., None], sign * qo / no[..., None], face)
    sd = torch.where(outside, no, qmax)
    return sd, n, x - sd[..., None] * n


def _to_local(R: torch.Tensor, c: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """World points ``p (..., k, 3)`` in the frame ``(R (..., 3, 3), c (..., 3))``."""
    return ((p - c[..., None, :]) @ R)  # (R^T (p - c))^T = (p - c)^T R


def _points_box(p: torch.Tensor, radius, R, c, half):
    """Rows of spheres at ``p (..., k, 3)`` (radius scalar or ``(..., k)``) against a box."""
    x = _to_local(R, c, p)
    sd, nl, sl = box_signed_distance(x, half[..., None, :])
    n = nl @ R.transpose(-1, -2)  # (R nl)^T
    surface = sl @ R.transpose(-1, -2) + c[..., None, :]
    phi = radius - sd
    point = 0.5 * ((p - radius[..., None] * n if torch.is_tensor(radius) else p - radius * n) + surface)
    return point, n, phi


def sphere_box_rows(centre, radius, R, c, half):
    """One row: a sphere (first shape) against a box (second).

    Args:
        centre: ``(..., 3)`` sphere centre, m. radius: ``(...)`` m.
        R, c, half: box orientation ``(..., 3, 3)``, centre ``(..., 3)`` and
            half extents ``(..., 3)`` (world frame).

    Returns:
        ``point (..., 1, 3)``, ``normal (..., 1, 3)`` (out of the box),
        ``penetration (..., 1)``.
    """
    return _points_box(centre[..., None, :], radius[..., None], R, c, half)


def capsule_box_rows(p0, p1, radius, R, c, half, margin: float = 1e-9):
    """Three rows: a capsule (first shape, axis ``[p0, p1]``) against a box.

    Rows 0 and 1 are the end caps as spheres. Row 2 is the capsule's axis
    against the box edge it lies across: for every edge, the closest points
    of the axis and the edge; the row is the most penetrating pair whose
    closest point on the axis lies strictly inside it (by ``margin`` of its
    length; the end caps are rows 0 and 1) and outside the box, else
    inactive. Together the rows attain the exact distance of the capsule to
    the box: a segment's nearest point to a convex box is an end point, or an
    interior point nearest to an edge or a corner (nearest to a face's
    interior only when parallel to it, where the end points are as near).

    Returns:
        ``point (..., 3, 3)``, ``normal (..., 3, 3)``, ``penetration (..., 3)``.
    """
    caps = torch.stack([p0, p1], -2)
    pt_c, n_c, phi_c = _points_box(caps, radius[..., None].expand(*radius.shape, 2), R, c, half)
    E = _EDGES.to(dtype=p0.dtype, device=p0.device) * half[..., None, None, :]  # (..., 12, 2, 3)
    Ew = E @ R[..., None, :, :].transpose(-1, -2) + c[..., None, None, :]
    a0, a1 = p0[..., None, :], p1[..., None, :]
    cs, ce = closest_points_segments(a0, a1, Ew[..., 0, :], Ew[..., 1, :])  # (..., 12, 3)
    s = _param(cs, a0, a1)
    t = _param(ce, Ew[..., 0, :], Ew[..., 1, :])
    diff = cs - ce
    d2 = (diff * diff).sum(-1)
    sd_axis = box_signed_distance(_to_local(R, c, cs), half[..., None, :])[0]
    ok = (s > margin) & (s < 1 - margin) & (d2 > 0) & (sd_axis > 0)
    d = torch.sqrt(torch.where(ok, d2, torch.ones_like(d2)))
    phi_e = torch.where(ok, radius[..., None] - d, torch.full_like(d, INACTIVE))
    n_e = torch.where(ok[..., None], diff / d[..., None], _unit_z(diff))
    best = phi_e.argmax(-1, keepdim=True)  # (..., 1)
    phi_x = phi_e.gather(-1, best)
    n_x = n_e.gather(-2, best[..., None].expand(*best.shape, 3))
    cs_x = cs.gather(-2, best[..., None].expand(*best.shape, 3))
    ce_x = ce.gather(-2, best[..., None].expand(*best.shape, 3))
    pt_x = 0.5 * ((cs_x - radius[..., None, None] * n_x) + ce_x)
    return torch.cat([pt_c, pt_x], -2), torch.cat([n_c, n_x], -2), torch.cat([phi_c, phi_x], -1)


#: Edge-crossing rows of a box-box pair (a face on a face turned against it
#: crosses in up to 8 points, the octagon of two squares at 45 degrees).
EDGE_CROSSINGS = 8

#: How far outside the other box an edge crossing's closest point may lie,
#: as a fraction of the crossing's depth (see ``_crossing_rows``).
CROSSING_SLACK = 0.1

#: Rows of a box-box pair.
BOX_BOX_ROWS = 16 + EDGE_CROSSINGS + 1


def box_box_rows(RA, cA, hA, RB, cB, hB, margin: float = 1e-5):
    """Twenty-five rows: box A (first shape) against box B (second).

    Rows 0-7: A's corners against B (normal out of B). Rows 8-15: B's
    corners against A (from B into A). Rows 16-23: edge crossings, the 8
    most penetrating of the 16 pairs of an edge of A's face towards B and
    an edge of B's face towards A (the reference and incident faces of the
    least-overlapping face axis) whose closest points lie strictly inside
    both edges (by ``margin`` of their lengths) and inside the other box
    (see ``_crossing_rows``); the penetration is the distance of the two
    closest points and the normal runs along it (the edges' common
    perpendicular). Row 24: for separated boxes only, the edge-edge
    axis of the separating-axis test when it separates them most (by more
    than ``margin`` times the sum of the half extents over every face axis):
    minus the distance of the two supporting edges, so that the largest
    penetration of all rows is minus the exact distance of separated boxes
    and the contact onset is smooth.

    Corners and crossings give the contact polygon that clipping one face
    against the other gives: a box resting face to face on another touches
    through the corners of the smaller face where one face lies within the
    other (4 rows; 8 where they coincide), and through corners and edge
    crossings where they overlap otherwise (a square on a square turned 45
    degrees: 8 crossings).

    Returns:
        ``point (..., 25, 3)``, ``normal (..., 25, 3)``, ``penetration (..., 25)``.
    """
    S = _CORNERS.to(dtype=cA.dtype, device=cA.device)
    zero = torch.zeros_like(cA[..., 0])
    cornA = (S * hA[..., None, :]) @ RA.transpose(-1, -2) + cA[..., None, :]
    cornB = (S * hB[..., None, :]) @ RB.transpose(-1, -2) + cB[..., None, :]
    pA, nA, phA = _points_box(cornA, zero[..., None].expand(*zero.shape, 8), RB, cB, hB)
    pB, nB, phB = _points_box(cornB, zero[..., None].expand(*zero.shape, 8), RA, cA, hA)
    sat = _sat(RA, cA, hA, RB, cB, hB, margin)
    pt_x, n_x, ph_x = _crossing_rows(RA, cA, hA, RB, cB, hB, sat, margin)
    pt_e, n_e, ph_e = _edge_row(RA, cA, hA, RB, cB, hB, sat)
    return (
        torch.cat([pA, pB, pt_x, pt_e], -2),
        torch.cat([nA, -nB, n_x, n_e], -2),
        torch.cat([phA, phB, ph_x, ph_e], -1),
    )


def _face_edges() -> torch.Tensor:
    """``(3, 2, 4)`` indices into :data:`_EDGES` of the 4 edges of face ``(axis, side)``."""
    E = _edges()
    out = torch.zeros(3, 2, 4, dtype=torch.long)
    for k in range(3):
        for side, sgn in enumerate((-1.0, 1.0)):
            # an edge of face k lies along another axis, with coordinate k at the face
            idx = [e for e in range(12) if E[e, 0, k] == sgn and E[e, 1, k] == sgn]
            out[k, side] = torch.tensor(idx)
    return out


_FACE_EDGES = _face_edges()


def _facing(R, N, sign):
    """The face of a box whose outward normal is nearest ``sign * N``: the
    indices ``(..., 4)`` of its edges."""
    c = (R * N[..., :, None]).sum(-2)  # (..., 3): axis_k . N
    k = c.abs().argmax(-1)
    side = ((sign * c.gather(-1, k[..., None])[..., 0]) >= 0).long()
    table = _FACE_EDGES.to(k.device)
    return table[k, side]


def _crossing_rows(RA, cA, hA, RB, cB, hB, sat, margin):
    """The :data:`EDGE_CROSSINGS` deepest edge crossings (see :func:`box_box_rows`).

    Candidates are the 16 pairs of an edge of A's face towards B and an edge
    of B's face towards A, the faces whose normals are nearest the face axis
    of the separating-axis test that overlaps least (oriented from B to A),
    the reference and incident faces of clipping (the edge axis where it
    overlaps least). A crossing counts where
    both closest points lie strictly inside their edges and each lies inside
    the other box, or outside by at most :data:`CROSSING_SLACK` of the
    crossing's depth (where a face rests on a face the crossings lie on the
    side faces of both boxes: signed distance 0, a little more under a tilt).
    """
    # The axis: the SAT's least-overlapping face axis, or its edge axis
    # where that wins (two edges crossing: their faces then tie and either
    # pair holds the crossing edges).
    N = torch.where(sat["edge_wins"][..., None], sat["L"], sat["N"])
    ia, ib = _facing(RA, N, -1.0), _facing(RB, N, 1.0)  # (..., 4) each
    E = _EDGES.to(dtype=cA.dtype, device=cA.device)
    EA = (E[ia] * hA[..., None, None, :]) @ RA[..., None, :, :].transpose(-1, -2) + cA[..., None, None, :]  # (..., 4, 2, 3)
    EB = (E[ib] * hB[..., None, None, :]) @ RB[..., None, :, :].transpose(-1, -2) + cB[..., None, None, :]
    a0, a1 = EA[..., :, None, 0, :], EA[..., :, None, 1, :]  # (..., 4, 1, 3)
    b0, b1 = EB[..., None, :, 0, :], EB[..., None, :, 1, :]  # (..., 1, 4, 3)
    ca, cb = closest_points_segments(a0, a1, b0, b1)  # (..., 4, 4, 3)
    s, t = _param(ca, a0, a1), _param(cb, b0, b1)
    ca, cb = ca.flatten(-3, -2), cb.flatten(-3, -2)  # (..., 16, 3)
    s, t = s.flatten(-2), t.flatten(-2)
    diff = cb - ca  # A's edge is inside B: A leaves along c_b - c_a
    d2 = (diff * diff).sum(-1)
    dd = torch.sqrt(torch.where(d2 > 0, d2, torch.ones_like(d2)))
    in_b = box_signed_distance(_to_local(RB, cB, ca), hB[..., None, :])[0] < CROSSING_SLACK * dd
    in_a = box_signed_distance(_to_local(RA, cA, cb), hA[..., None, :])[0] < CROSSING_SLACK * dd
    ok = (s > margin) & (s < 1 - margin) & (t > margin) & (t < 1 - margin) & in_a & in_b & (d2 > 0)
    phi = torch.where(ok, dd, torch.full_like(dd, INACTIVE))
    n = torch.where(ok[..., None], diff / dd[..., None], _unit_z(diff))
    phi, idx = phi.topk(EDGE_CROSSINGS, dim=-1)
    ix = idx[..., None].expand(*idx.shape, 3)
    point = 0.5 * (ca.gather(-2, ix) + cb.gather(-2, ix))
    return point, n.gather(-2, ix), phi


def _sat(RA, cA, hA, RB, cB, hB, margin):
    """The separating-axis test's 15 overlaps (Ericson 4.4.1): the face axes
    ``u_k`` of A and ``w_k`` of B and the edge axes ``u_i x w_j`` (oriented
    from B towards A). Returns the least overlap of the face axes with its
    axis, and of the edge axes with their index and axes, and whether the
    edge axis wins (by ``margin`` times the sum of the half extents)."""
    u = RA.transpose(-1, -2)  # (..., 3, 3): row i is A's axis u_i
    w = RB.transpose(-1, -2)
    d = cA - cB
    L = torch.linalg.cross(u[..., :, None, :], w[..., None, :, :])  # (..., 3, 3, 3): u_i x w_j
    L2 = (L * L).sum(-1)
    valid = L2 > 1e-12  # parallel edges have no edge-edge axis
    Ln = L / torch.sqrt(torch.where(valid, L2, torch.ones_like(L2)))[..., None]
    sgn = torch.where((Ln * d[..., None, None, :]).sum(-1) >= 0, 1.0, -1.0).to(d.dtype)
    Ln = Ln * sgn[..., None]  # oriented from B towards A
    uL = (u[..., None, None, :, :] * Ln[..., None, :]).sum(-1)  # (..., 3, 3, 3): u_k . L_ij
    wL = (w[..., None, None, :, :] * Ln[..., None, :]).sum(-1)
    depth = (uL.abs() * hA[..., None, None, :]).sum(-1) + (wL.abs() * hB[..., None, None, :]).sum(-1)
    depth = depth - (Ln * d[..., None, None, :]).sum(-1)
    big = torch.full_like(depth, float("inf"))
    depth_e = torch.where(valid, depth, big).flatten(-2)  # (..., 9)
    # Face axes: A's u_k and B's w_k.
    uw = u @ w.transpose(-1, -2)  # (..., 3, 3): u_i . w_j
    du, dw = (u * d[..., None, :]).sum(-1), (w * d[..., None, :]).sum(-1)
    face_a = hA + (uw.abs() * hB[..., None, :]).sum(-1) - du.abs()
    face_b = hB + (uw.abs().transpose(-1, -2) * hA[..., None, :]).sum(-1) - dw.abs()
    face, best_f = torch.cat([face_a, face_b], -1).min(-1)
    axes = torch.cat([u, w], -2)  # (..., 6, 3)
    N = axes.gather(-2, best_f[..., None, None].expand(*best_f.shape, 1, 3))[..., 0, :]
    N = N * torch.where((N * d).sum(-1) >= 0, 1.0, -1.0).to(d.dtype)[..., None]  # from B towards A
    best_e, idx = depth_e.min(-1)
    scale = hA.sum(-1) + hB.sum(-1)
    edge_wins = best_e < face - margin * scale
    Lb = Ln.flatten(-3, -2).gather(-2, idx[..., None, None].expand(*idx.shape, 1, 3))[..., 0, :]
    return {"u": u, "w": w, "face": face, "N": N, "best_e": best_e, "idx": idx, "L": Lb, "edge_wins": edge_wins}


def _edge_row(RA, cA, hA, RB, cB, hB, sat):
    u, w, idx, best_e, Lb = sat["u"], sat["w"], sat["idx"], sat["best_e"], sat["L"]
    d = cA - cB
    active = sat["edge_wins"]
    i, j = idx // 3, idx % 3
    # Supporting edges: A's edge along u_i at the corner furthest towards B
    # (along -L), B's along w_j furthest towards A (along +L).
    uLb = (u * Lb[..., None, :]).sum(-1)
    wLb = (w * Lb[..., None, :]).sum(-1)
    oh_i = torch.nn.functional.one_hot(i, 3).to(d.dtype)
    oh_j = torch.nn.functional.one_hot(j, 3).to(d.dtype)
    sa = -torch.where(uLb >= 0, 1.0, -1.0).to(d.dtype) * (1 - oh_i)
    sb = torch.where(wLb >= 0, 1.0, -1.0).to(d.dtype) * (1 - oh_j)
    ea = cA + ((sa * hA)[..., None] * u).sum(-2)
    eb = cB + ((sb * hB)[..., None] * w).sum(-2)
    ua = ((oh_i * hA)[..., None] * u).sum(-2)
    wb = ((oh_j * hB)[..., None] * w).sum(-2)
    ca, cb = closest_points_segments(ea - ua, ea + ua, eb - wb, eb + wb)
    point = 0.5 * (ca + cb)
    # Separated along the axis: the distance of the two edges, an achieved
    # distance between the boxes (the separation along the axis is only a
    # lower bound of it when the edges' closest points are not interior).
    gap2 = ((ca - cb) ** 2).sum(-1)
    sep = best_e < 0
    gap = torch.sqrt(torch.where(sep & (gap2 > 0), gap2, torch.ones_like(gap2)))
    best_e = torch.where(gap2 > 0, -gap, torch.zeros_like(gap))
    # Overlapping boxes touch through corners and edge crossings instead.
    active = active & sep
    best_e = torch.where(active, best_e, torch.full_like(best_e, INACTIVE))
    n = torch.where(active[..., None], Lb, _unit_z(Lb))
    return point[..., None, :], n[..., None, :], best_e[..., None]


def _param(x, p0, p1):
    """The parameter ``s`` of ``x = p0 + s (p1 - p0)`` (0 for a point segment)."""
    d = p1 - p0
    dd = (d * d).sum(-1)
    ok = dd > 0
    return torch.where(ok, ((x - p0) * d).sum(-1) / torch.where(ok, dd, torch.ones_like(dd)), torch.zeros_like(dd))


def _unit_z(like: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(like)
    z[..., 2] = 1.0
    return z
