"""One Simulator contact step at batch N where some samples drop a foot: two checkouts, CPU time.

States as in ``tests/test_contact_unilateral.py`` (``_batch``): stances 3 mm
sunk with random velocities, and in a share ``2 FRAC`` of the samples one
leg's servo target pulled up hard, so about ``FRAC`` of them drop a foot
(the unilateral step's re-solve). The two checkouts alternate, minimum of 7
CPU times each (one thread, freed memory retained).

    python benchmarks/contact_dropped_ab.py OLD_SRC NEW_SRC quadruped|example-robot-data:go1 float64 N [FRAC]
"""
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _checkouts import import_pair
OLD, NEW, name, dtype, N = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
frac = float(sys.argv[6]) if len(sys.argv) > 6 else 0.25
torch.set_num_threads(1)
old, new = import_pair(OLD, NEW)
new.runtime.retain_freed_memory()
DT = 4e-3
def setup(pkg):
    robot = pkg.data.load(name, floating_base=True, dtype=getattr(torch, dtype))
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = pkg.contact.ContactModel(robot, pkg.contact.ContactGeometry.from_model(robot, links=feet))
    sim = pkg.sim.Simulator(robot, DT, actuator=pkg.sim.PDActuator(kp=60.0, kd=1.0), contact=cm)
    g = torch.Generator().manual_seed(0)
    F = robot.dtype
    q = robot.neutral().expand(N, -1).clone()
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.5] * 4, dtype=F) + 0.1 * torch.randn(N, 12, generator=g, dtype=F)
    q = cm.place_on_terrain(robot, q, clearance=-0.003)
    v = 0.3 * torch.randn(N, robot.nv, generator=g, dtype=F)
    u = q[:, 7:] + 0.05 * torch.randn(N, 12, generator=g, dtype=F)
    leg = torch.randint(0, 4, (N,), generator=g)
    rows = torch.nonzero(torch.rand(N, generator=g) < 2 * frac).flatten()
    u[rows, 3 * leg[rows] + 1] += 1.0
    u[rows, 3 * leg[rows] + 2] -= 1.0
    def f():
        with torch.no_grad():
            return sim._advance_contact(q, v, u)
    return f
fs = {"old": setup(old), "new": setup(new)}
out = {k: f() for k, f in fs.items()}
best = {k: 1e9 for k in fs}
for _ in range(7):
    for k, f in fs.items():
        c = time.process_time(); f(); best[k] = min(best[k], time.process_time() - c)
print(f"{name} {dtype} N={N}: old {best['old']*1e3:.1f} ms, new {best['new']*1e3:.1f} ms, new/old {best['new']/best['old']:.3f}; max |dv| {float((out['old'][1]-out['new'][1]).abs().max()):.1e}")
