"""compile_step (torch.compile of the simulation step) against the eager Simulator.step.

The robot is small on purpose (a floating body with one leg, two contact
spheres on the ground): inductor compiles the quadruped's contact step for
minutes on a 2-core machine, this one's in tens of seconds, and it has every
part of the contact step (floating base, joint, PD actuator, contact
detection, the force law, the implicit solve).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from backdrive import CompilerUnavailableError, InputError, RobotModel
from backdrive.contact import ContactGeometry, ContactModel
from backdrive.sim import PDActuator, Simulator, State, compile_step

HOPPER = """<robot name="hopper">
  <link name="body">
    <inertial><mass value="2.0"/><inertia ixx="0.02" ixy="0" ixz="0" iyy="0.03" iyz="0" izz="0.04"/></inertial>
  </link>
  <joint name="hip" type="revolute">
    <parent link="body"/><child link="leg"/>
    <origin xyz="0.05 0 -0.05"/><axis xyz="0 1 0"/>
    <limit lower="-2" upper="2" effort="50" velocity="20"/>
    <dynamics damping="0.05" friction="0.02"/>
  </joint>
  <link name="leg">
    <inertial><origin xyz="0 0 -0.1"/><mass value="0.3"/>
      <inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.0001"/></inertial>
  </link>
  <joint name="ankle" type="fixed">
    <parent link="leg"/><child link="foot"/><origin xyz="0 0 -0.2"/>
  </joint>
  <link name="foot"/>
</robot>"""


def _sim(dtype):
    robot = RobotModel.from_urdf(HOPPER, floating_base=True, dtype=dtype)
    contact = ContactModel(robot, ContactGeometry.spheres(robot, {"body": 0.05, "foot": 0.02}))
    return Simulator(robot, 0.005, actuator=PDActuator(kp=20.0, kd=0.5), contact=contact)


def _state(sim, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    kw = {"dtype": sim.dtype}
    q = torch.zeros(batch, sim.nq, **kw)
    # Base heights from 0.22 to 0.27 m: the foot (0.25 m below the base at
    # q_hip = 0) starts in contact in some copies and in the air in others.
    q[:, 2] = 0.22 + 0.05 * torch.rand(batch, generator=g, **kw)
    q[:, 3] = 1.0
    q[:, 7] = 0.3 * torch.randn(batch, generator=g, **kw)
    v = 0.3 * torch.randn(batch, sim.nv, generator=g, **kw)
    u = 0.2 * torch.randn(batch, sim.nu, generator=g, **kw)
    return q, v, u


def _rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


@pytest.mark.slow
# Float32 tolerance 1e-5, not 1e-6: one step differed by 2.1e-6 of the
# largest velocity. The contact force is a stiffness (4e4 N/m) times a
# penetration of about a millimetre, the difference of two heights of about
# 0.25 m, so float32 keeps only about 15 bits of it in either path, and the
# fused kernels round differently. The test also checks that the compiled
# float32 step is as close to the float64 step as the eager float32 one is.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["f32", "f64"])
def test_compiled_step_equals_the_eager_step(dtype, tol):
    sim = _sim(dtype)
    step = compile_step(sim)
    q, v, u = _state(sim, 16)
    with warnings.catch_warnings():
        # A fallback would make the comparison trivial (torch's own deprecation warnings are not ours).
        warnings.filterwarnings("error", message="compile_step")
        # One step from each of several states, so the contact sets change
        # between calls (one graph serves them all). Each step starts from
        # the eager state: over many steps rounding differences grow with the
        # contact's stiffness (float32: 1.7e-6 of the largest velocity after 5).
        s_e = State(q, v)
        sim64 = _sim(torch.float64)
        # The compiled graph traces the joint-solve contact step (the fast
        # contact step's in-place kernels are not for dynamo); the eager
        # default takes the contact's own step: the same equations, other
        # float32 rounding. The rounding check compares like with like.
        traced = _sim(dtype)
        traced._joint_solve_contact = True
        for _ in range(5):
            s_c, s_next = step(s_e, u), sim.step(s_e, u)
            assert _rel_err(s_c.q, s_next.q) <= tol and _rel_err(s_c.v, s_next.v) <= tol
            if dtype == torch.float32:
                exact = sim64.step(State(s_e.q.double(), s_e.v.double()), u.double()).v
                eager = traced.step(s_e, u).v.double()
                assert _rel_err(s_c.v.double(), exact) <= 2 * max(_rel_err(eager, exact), 1e-7)
            s_e = s_next
        assert step.compiled and step.eager_reason is None
    assert (s_e.q[:, 2] - q[:, 2]).abs().max() > 1e-4  # it moved: the comparison is not trivial


@pytest.mark.slow
def test_gradients_through_the_compiled_step_equal_the_eager_ones():
    # AOTAutograd traces the backward pass (through the step's hand-written
    # autograd Functions) into a graph; the aot_eager backend runs those
    # graphs without inductor's code generation, which took minutes here
    # for the backward graph on the loaded 2-core machine.
    dtype, tol = torch.float64, 1e-12
    sim = _sim(dtype)
    step = compile_step(sim, backend="aot_eager")
    q, v, u = _state(sim, 8)
    q0, v0, u0 = (x.clone().requires_grad_(True) for x in (q, v, u))
    w = torch.randn(sim.nv, dtype=dtype, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (step, sim.step):
        s1 = fn(State(q0, v0), u0)
        grads.append(torch.autograd.grad((s1.v * w).sum() + s1.q[:, 2].sum(), (q0, v0, u0)))
    assert step.compiled
    for g_c, g_e in zip(*grads):
        assert g_e.abs().max() > 0
        assert _rel_err(g_c, g_e) <= 10 * tol


@pytest.mark.slow  # dynamo traces the step before the backend fails: tens of seconds
def test_a_failing_compiler_falls_back_to_the_eager_step_with_a_warning():
    def broken_backend(gm, example_inputs):
        raise RuntimeError("this backend cannot compile anything")

    sim = _sim(torch.float64)
    step = compile_step(sim, backend=broken_backend)
    q, v, u = _state(sim, 4)
    with pytest.warns(RuntimeWarning, match="cannot build this simulation step.*runs eagerly"):
        out = step(State(q, v), u)
    assert not step.compiled and "this backend cannot compile anything" in step.eager_reason
    ref = sim.step(State(q, v), u)
    assert torch.equal(out.q, ref.q) and torch.equal(out.v, ref.v)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile_step")  # warned once; later calls are quietly eager
        again = step(State(q, v), u)
    assert torch.equal(again.v, ref.v)
    strict = compile_step(sim, backend=broken_backend, fallback=False)
    with pytest.raises(CompilerUnavailableError, match="torch.compile failed on the simulation step"):
        strict(State(q, v), u)


def test_no_compiler_falls_back_at_once(monkeypatch):
    import backdrive.sim._compile as mod

    def unavailable(device, backend):
        raise CompilerUnavailableError("no C++ compiler here")

    monkeypatch.setattr(mod, "_check_compiler", unavailable)
    sim = _sim(torch.float64)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler here"):
        step = compile_step(sim)
    q, v, u = _state(sim, 3)
    assert torch.equal(step(State(q, v), u).q, sim.step(State(q, v), u).q)
    with pytest.raises(CompilerUnavailableError, match="no C\\+\\+ compiler here"):
        compile_step(sim, fallback=False)


def test_bad_arguments_are_named():
    sim = _sim(torch.float64)
    with pytest.raises(InputError, match="needs a backdrive.sim.Simulator"):
        compile_step(sim.robot)
    with pytest.raises(InputError, match="fallback must be True or False"):
        compile_step(sim, fallback="yes")
    with pytest.raises(InputError, match="backend must be"):
        compile_step(sim, backend=3)
    step = compile_step(sim, backend="eager")
    q, v, u = _state(sim, 2)
    with pytest.raises(InputError, match="control must have shape"):
        step(State(q, v), u[:, :0])


# ------------------------------------------------ QuadrupedWalk(compile=...)
def _walk_pair(batch, **kw):
    from backdrive.envs import QuadrupedWalk

    settings = dict(privileged=True, gait_frequency=3.0, dtype=torch.float64)
    eager, compiled = QuadrupedWalk(batch, **settings), QuadrupedWalk(batch, **settings, **kw)
    eager.reset(seed=1)
    compiled.reset(seed=1)
    return eager, compiled


@pytest.mark.slow  # dynamo traces the quadruped's substep: 5-30 s with the load
def test_quadruped_walk_steps_through_the_compiled_step():
    # Dynamo traces the env's contact substep into one graph (fullgraph) and
    # the "eager" backend runs it with torch's own kernels: this checks the
    # env's wiring (the compiled step is what steps the batch, with its
    # effort, normal force and slip velocity) in seconds. Inductor's code for
    # the same step is compared with the eager step by the tests above (on a
    # smaller robot: minutes for this one) and in benchmarks/scaling.py
    # --compile-env.
    from backdrive.sim import CompiledStep

    eager, env = _walk_pair(4, compile="eager")
    assert isinstance(env.compiled_step, CompiledStep) and eager.compiled_step is None
    (rows, stepper), = env._simulators(env.split(env.state))
    assert rows is None and stepper is env.compiled_step
    a = (0.5 * torch.randn(4, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)).requires_grad_()
    w = torch.randn(4, env.state_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile_step")  # a fallback would make this trivial
        s_c = env.transition(env.state, a)
        s_c2 = env.transition(s_c, a)  # a state with a graph: the same compiled graph
    s_e = eager.transition(eager.state, a)
    s_e2 = eager.transition(s_e, a)
    assert env.compiled_step.compiled
    assert len(env.compiled_step._ready) == 1  # one graph for both grad patterns of the state
    torch.testing.assert_close(s_c2, s_e2, rtol=1e-12, atol=1e-12)
    assert (s_e2[:, :19] - eager.state[:, :19]).abs().max() > 1e-3  # it moved
    g_c, = torch.autograd.grad((s_c2 * w).sum(), a)
    g_e, = torch.autograd.grad((s_e2 * w).sum(), a)
    assert g_e.abs().max() > 1.0
    torch.testing.assert_close(g_c, g_e, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(env._aux["effort2"], eager._aux["effort2"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(env._aux["slip2"], eager._aux["slip2"], rtol=1e-12, atol=1e-12)


def test_quadruped_walk_compile_falls_back_without_a_compiler(monkeypatch):
    import backdrive.sim._compile as mod

    def unavailable(device, backend):
        raise CompilerUnavailableError("no C++ compiler here")

    monkeypatch.setattr(mod, "_check_compiler", unavailable)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler here.*runs eagerly"):
        eager, env = _walk_pair(3, compile=True)
    assert not env.compiled_step.compiled
    a = 0.3 * torch.ones(3, 12, dtype=torch.float64)
    assert torch.equal(env.transition(env.state, a), eager.transition(eager.state, a))


def test_compile_options_are_checked():
    from backdrive.envs import QuadrupedWalk

    for bad in (3, "", None):
        with pytest.raises(InputError, match="compile must be True, False or a torch.compile backend name"):
            QuadrupedWalk(1, compile=bad)
    sim = _sim(torch.float64)
    with pytest.raises(InputError, match="unknown ContactResult fields"):
        compile_step(sim, contact_record=("normal_force", "nope"))
    with pytest.raises(InputError, match="contact_record must be a tuple"):
        compile_step(sim, contact_record="normal_force")
    with pytest.raises(InputError, match="needs a simulator with contact"):
        compile_step(sim.replace(contact=None), contact_record=("normal_force",))
