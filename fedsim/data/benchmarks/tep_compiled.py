"""The TEP plant and Ricker's controller advanced by compiled code (numba), on tep-studio's own plant model.

One control interval of :meth:`tep_studio.TennesseeEastmanProcess.advance` under
:class:`tep_studio.RickerMultiLoopController` is, in tep-studio 0.2.0, Python around a compiled model: the
controller's PI laws, the clip, ``set_inputs``, fixed-step RK4 at 0.0005 h (20 substeps of 4 derivative calls in
a 0.01-h interval), the output evaluation with its measurement noise and the shutdown check. :func:`run_control`
does the same work in one numba-compiled loop that calls the functions tep-studio's native extension exports
(``tep_set_inputs``, ``tep_derivatives``, ``tep_outputs``, ``tep_shutdown_code``) through function pointers on the
kernel's own model handle, so the model, its random generator and its shutdown logic stay tep-studio's; the
trajectories equal tep-studio's bit for bit (``tests/test_tep_compiled.py`` compares them).

The seam: tep-studio exposes no pointer to its model, so :class:`CompiledPlant` takes the native handle of a
``TennesseeEastmanProcess``'s kernel (``kernel._handle``) and the addresses of the extension's exported functions
(``tep_studio.simulation.native.lib``); everything else (reset, snapshots, the shutdown message) goes through
tep-studio's public methods. The controller is re-implemented from the public loop table
(``tep_studio.control.registry.RICKER_MODE1``, the setpoints of ``mode_setpoints``) with tep-studio's defaults
(composition trims on, %G feedback and overrides off): the arithmetic of ``DiscretePI``/``VelocityPI`` and
``compute_action`` in the same order, so the floating-point results are the same.

RK4 as tep-studio has it: ``k3`` is evaluated at the same time as ``k2``, and the model's ``tefunc`` skips its
state-to-rates block when called twice at one time, so ``k3`` reuses ``k2``'s plant rates; calling the same C
function in the same sequence reproduces this.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
from numba import njit

# Controller loops, in one table: the seven ratio (feed/flow) loops, then the positional PI loops, then the two
# velocity loops (Ricker 1996, tep-studio's RICKER_MODE1).
NUM_FEED = 7
PRODUCTION, REACTOR_LEVEL, REACTOR_PRESSURE, REACTOR_TEMPERATURE = 7, 8, 9, 10
SEPARATOR_LEVEL, SEPARATOR_TEMPERATURE, STRIPPER_LEVEL, PCT_G, YA, YAC = 11, 12, 13, 14, 15, 16
NUM_LOOPS = 17
# loop parameters (columns of ``loop_params``) and memories (columns of ``loop_state``)
KC, TI, TS, HI, LO, PV = range(6)
OUTPUT, PREV_ERROR, LAST_TIME = range(3)
# controller scalars (``scalars``): nominal conditions and setpoints
FP_BASE, PROD_RATE, PCTG_RATE, P2, P3, FF_D, FF_E, EADJ0 = 0, 1, 2, 3, 6, 9, 10, 11
SP_REACTOR_LEVEL, SP_REACTOR_PRESSURE, SP_REACTOR_TEMPERATURE, SP_SEPARATOR_LEVEL = 12, 13, 14, 15
SP_STRIPPER_LEVEL, SP_PCT_G, SP_PRODUCTION, SP_YA, SP_YAC = 16, 17, 18, 19, 20
NUM_SCALARS = 21
# controller memory besides the loops (``ctl``)
R1, R4, FP, RAMPED_PRODUCTION, RAMPED_PCT_G, RAMP_TIME = range(6)
NUM_CTL = 6
# integer parameters (``ints``): measurement indices, driven MVs
A_IDX, C_IDX, MV_REACTOR_COOLING, MV_CONDENSER, PROD_PV, PCTG_PV = range(6)
SAMPLE_EPS = 1e-9  # tep_studio.control.pi._SAMPLE_EPS

# run_control's status
RUNNING, SHUTDOWN, DIVERGED = 0, 1, 2


@njit(cache=True)
def _clip(value, lo, hi):
    if value < lo:
        return lo
    if value > hi:
        return hi
    return value


@njit(cache=True)
def _ramp(current, target, rate, dt):
    step = abs(rate) * dt
    if target >= current:
        return min(target, current + step)
    return max(target, current - step)


@njit(cache=True)
def _positional(loop_params, loop_state, i, setpoint, measurement, time):
    """DiscretePI.update: the saturated output, held between samples."""
    if not (time - loop_state[i, LAST_TIME] >= loop_params[i, TS] - SAMPLE_EPS):
        return loop_state[i, OUTPUT]
    dt = time - loop_state[i, LAST_TIME]
    error = setpoint - measurement
    delta = loop_params[i, KC] * (error - loop_state[i, PREV_ERROR] + (dt / loop_params[i, TI]) * error)
    output = _clip(loop_state[i, OUTPUT] + delta, loop_params[i, LO], loop_params[i, HI])
    loop_state[i, OUTPUT] = output
    loop_state[i, PREV_ERROR] = error
    loop_state[i, LAST_TIME] = time
    return output


@njit(cache=True)
def _velocity(loop_params, loop_state, i, setpoint, measurement, time):
    """VelocityPI.update: the increment, 0 between samples."""
    if not (time - loop_state[i, LAST_TIME] >= loop_params[i, TS] - SAMPLE_EPS):
        return 0.0
    dt = time - loop_state[i, LAST_TIME]
    error = setpoint - measurement
    delta = loop_params[i, KC] * (error - loop_state[i, PREV_ERROR] + (dt / loop_params[i, TI]) * error)
    loop_state[i, OUTPUT] = 0.0
    loop_state[i, PREV_ERROR] = error
    loop_state[i, LAST_TIME] = time
    return delta


@njit(cache=True)
def _loop(loop_params, loop_state, i, setpoint, meas, time):
    """Positional loop ``i`` on its own measurement."""
    return _positional(loop_params, loop_state, i, setpoint, meas[int(loop_params[i, PV])], time)


@njit(cache=True)
def _production(loop_params, loop_state, ctl, scalars, meas, time):
    """The setpoint ramps and the production loop: the feed rate ``fp`` (kept in ``ctl[FP]``)."""
    dt = max(0.0, time - ctl[RAMP_TIME])
    ctl[RAMP_TIME] = time
    ctl[RAMPED_PRODUCTION] = _ramp(ctl[RAMPED_PRODUCTION], scalars[SP_PRODUCTION], scalars[PROD_RATE], dt)
    ctl[RAMPED_PCT_G] = _ramp(ctl[RAMPED_PCT_G], scalars[SP_PCT_G], scalars[PCTG_RATE], dt)
    fp_adj = _loop(loop_params, loop_state, PRODUCTION, ctl[RAMPED_PRODUCTION], meas, time)
    fp = scalars[FP_BASE] + fp_adj
    ctl[FP] = fp
    return fp


@njit(cache=True)
def _composition(loop_params, loop_state, ctl, scalars, ints, meas, fp, time):
    """The feed ratios r1..r4: the %G polynomials with their feed-forward on ``fp``, and the A and A+C composition
    trims (velocity loops) accumulated in ``ctl``."""
    eadj = scalars[EADJ0]
    g = ctl[RAMPED_PCT_G]
    poly2 = ((0.0 * g + scalars[P2]) * g + scalars[P2 + 1]) * g + scalars[P2 + 2]  # np.polyval's Horner loop
    poly3 = ((0.0 * g + scalars[P3]) * g + scalars[P3 + 1]) * g + scalars[P3 + 2]
    r2 = poly2 - scalars[FF_D] * eadj * fp
    r3 = poly3 + scalars[FF_E] * eadj * fp
    a = meas[ints[A_IDX]]
    c = meas[ints[C_IDX]]
    total = a + c
    ya = 100.0 * a / total if total != 0.0 else 0.0
    yac = a + c
    d_ya = _velocity(loop_params, loop_state, YA, scalars[SP_YA], ya, time)
    d_yac = _velocity(loop_params, loop_state, YAC, scalars[SP_YAC], yac, time)
    ctl[R1] += d_ya
    ctl[R4] += d_yac - d_ya
    return ctl[R1], r2, r3, ctl[R4]


@njit(cache=True)
def control_action(controller, meas, time, action):
    """RickerMultiLoopController.compute_action (composition trims on, %G feedback and overrides off) into
    ``action``; updates the loop memories. ``controller`` is :meth:`ControllerTable.arrays` with the memories
    ``(loop_params, loop_state, ctl, scalars, ints, feed_ratio, feed_mv, static_idx, static_val)``."""
    loop_params, loop_state, ctl, scalars, ints, feed_ratio, feed_mv, static_idx, static_val = controller
    fp = _production(loop_params, loop_state, ctl, scalars, meas, time)
    r1, r2, r3, r4 = _composition(loop_params, loop_state, ctl, scalars, ints, meas, fp, time)
    sep_temp_sp = _loop(loop_params, loop_state, REACTOR_LEVEL, scalars[SP_REACTOR_LEVEL], meas, time)
    r6 = _loop(loop_params, loop_state, SEPARATOR_LEVEL, scalars[SP_SEPARATOR_LEVEL], meas, time)
    r7 = _loop(loop_params, loop_state, STRIPPER_LEVEL, scalars[SP_STRIPPER_LEVEL], meas, time)
    r5 = _loop(loop_params, loop_state, REACTOR_PRESSURE, scalars[SP_REACTOR_PRESSURE], meas, time)
    condenser = _loop(loop_params, loop_state, SEPARATOR_TEMPERATURE, sep_temp_sp, meas, time)
    reactor_cooling = _loop(loop_params, loop_state, REACTOR_TEMPERATURE, scalars[SP_REACTOR_TEMPERATURE], meas, time)

    ratios = (r1, r2, r3, r4, r5, r6, r7)
    action[:] = 0.0
    for i in range(NUM_FEED):
        action[feed_mv[i]] = _loop(loop_params, loop_state, i, ratios[feed_ratio[i]] * fp, meas, time)
    action[ints[MV_REACTOR_COOLING]] = reactor_cooling
    action[ints[MV_CONDENSER]] = condenser
    for j in range(static_idx.shape[0]):
        action[static_idx[j]] = static_val[j]
    for j in range(action.shape[0]):
        action[j] = _clip(action[j], 0.0, 100.0)


@njit(cache=True)
def rk4(derivatives, handle, state, y, start, end, fixed_step, scratch):
    """tep-studio's fixed-step RK4 from ``state`` at ``start`` to ``end`` into ``y`` (``scratch``: five work
    vectors); ``k3`` at the time of ``k2``, as tep-studio evaluates it."""
    k1, k2, k3, k4, tmp = scratch
    nx = state.shape[0]
    n = max(1, int(np.rint((end - start) / fixed_step)))
    h = (end - start) / n
    half = 0.5 * h
    sixth = h / 6.0
    t = start
    for i in range(nx):
        y[i] = state[i]
    for _ in range(n):
        k1[:] = 0.0
        derivatives(handle, t, y.ctypes.data, k1.ctypes.data)
        for i in range(nx):
            tmp[i] = y[i] + half * k1[i]
        k2[:] = 0.0
        derivatives(handle, t + 0.5 * h, tmp.ctypes.data, k2.ctypes.data)
        for i in range(nx):
            tmp[i] = y[i] + half * k2[i]
        k3[:] = 0.0
        derivatives(handle, t + 0.5 * h, tmp.ctypes.data, k3.ctypes.data)
        for i in range(nx):
            tmp[i] = y[i] + h * k3[i]
        k4[:] = 0.0
        derivatives(handle, t + h, tmp.ctypes.data, k4.ctypes.data)
        for i in range(nx):
            y[i] = y[i] + sixth * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i])
        t += h


@njit(cache=True)
def run_control(native, handle, state, clock, meas, action, idv, controller, interval, fixed_step, sampling, out):
    """Advance plant and controller ``skip + per_sample * len(out)`` control intervals, recording
    ``meas[meas_idx]`` then ``action[mv_idx]`` (the implemented MVs) into each row of ``out`` every ``per_sample``
    intervals after the first ``skip``; ``sampling`` is ``(skip, per_sample, meas_idx, mv_idx)``. ``native`` holds
    the model's functions (:func:`native_functions`), ``controller`` the controller's arrays (:func:`control_action`).
    ``state`` (50), ``clock`` ([time]), ``meas`` (41), ``action`` (12) and the controller memories are updated in
    place. Returns (status, intervals done): ``SHUTDOWN`` when the model reports a shutdown after an interval (the
    interval is counted), ``DIVERGED`` when RK4 left the finite numbers (the interval is not counted; ``state`` and
    ``clock`` keep its start)."""
    set_inputs, derivatives, outputs, shutdown_code = native
    skip, per_sample, meas_idx, mv_idx = sampling
    nx = state.shape[0]
    scratch = (np.empty(nx), np.empty(nx), np.empty(nx), np.empty(nx), np.empty(nx))
    y = np.empty(nx)
    extras = (np.zeros(32), np.zeros(21), np.zeros(62), np.zeros(96))
    n_meas = meas_idx.shape[0]
    total = skip + per_sample * out.shape[0]
    for done in range(total):
        start = clock[0]
        control_action(controller, meas, start, action)
        for j in range(action.shape[0]):  # advance(): the implemented action is the clipped request
            action[j] = min(max(action[j], 0.0), 100.0)
        set_inputs(handle, action.ctypes.data, idv.ctypes.data)
        end = start + interval
        rk4(derivatives, handle, state, y, start, end, fixed_step, scratch)
        for i in range(nx):
            if not np.isfinite(y[i]):
                return DIVERGED, done
        for i in range(nx):
            state[i] = y[i]
        clock[0] = end
        add, dist, monitor, comp = extras
        outputs(
            handle,
            end,
            state.ctypes.data,
            meas.ctypes.data,
            add.ctypes.data,
            dist.ctypes.data,
            monitor.ctypes.data,
            comp.ctypes.data,
        )
        if shutdown_code(handle) != 0.0:
            return SHUTDOWN, done + 1
        if done >= skip and (done + 1 - skip) % per_sample == 0:
            row = (done + 1 - skip) // per_sample - 1
            for j in range(n_meas):
                out[row, j] = meas[meas_idx[j]]
            for j in range(mv_idx.shape[0]):
                out[row, n_meas + j] = action[mv_idx[j]]
    return RUNNING, total


_VOID = ctypes.c_void_p
_FUNCTIONS: Optional[tuple] = None


def native_functions() -> tuple:
    """Function pointers to tep-studio's exported model functions: (set_inputs, derivatives, outputs,
    shutdown_code), typed for numba."""
    global _FUNCTIONS
    if _FUNCTIONS is None:
        from tep_studio.simulation.native import ffi, lib

        def pointer(name: str, restype, *argtypes):
            address = int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
            return ctypes.CFUNCTYPE(restype, *argtypes)(address)

        _FUNCTIONS = (
            pointer("tep_set_inputs", None, _VOID, _VOID, _VOID),
            pointer("tep_derivatives", ctypes.c_int, _VOID, ctypes.c_double, _VOID, _VOID),
            pointer("tep_outputs", ctypes.c_int, _VOID, ctypes.c_double, *([_VOID] * 6)),
            pointer("tep_shutdown_code", ctypes.c_double, _VOID),
        )
    return _FUNCTIONS


def controller_scalars(nominal, sp) -> np.ndarray:
    """The controller's scalars (:data:`NUM_SCALARS`): the registry's nominal conditions and the mode's setpoints."""
    scalars = np.zeros(NUM_SCALARS, dtype=np.float64)
    scalars[FP_BASE] = nominal.fp_base
    scalars[PROD_RATE] = nominal.production_sp_rate_limit
    scalars[PCTG_RATE] = nominal.pct_g_sp_rate_limit
    scalars[P2 : P2 + 3] = nominal.p2_coeffs
    scalars[P3 : P3 + 3] = nominal.p3_coeffs
    scalars[FF_D], scalars[FF_E], scalars[EADJ0] = nominal.ff_gain_d, nominal.ff_gain_e, nominal.eadj0
    scalars[SP_REACTOR_LEVEL] = sp.reactor_level
    scalars[SP_REACTOR_PRESSURE] = sp.reactor_pressure
    scalars[SP_REACTOR_TEMPERATURE] = sp.reactor_temperature
    scalars[SP_SEPARATOR_LEVEL] = sp.separator_level
    scalars[SP_STRIPPER_LEVEL] = sp.stripper_level
    scalars[SP_PCT_G] = sp.pct_g
    scalars[SP_PRODUCTION] = sp.production_rate
    scalars[SP_YA] = sp.ya
    scalars[SP_YAC] = sp.yac
    return scalars


class ControllerTable:
    """The parameters of Ricker's controller in tep-studio's defaults, as arrays for :func:`control_action`.

    Built from ``RickerMultiLoopController``'s public registry, schema and setpoints; a controller with the %G
    feedback or the overrides switched on is refused (:func:`control_action` does not implement them).
    """

    def __init__(self, controller) -> None:
        if not controller.enable_composition or controller.enable_pct_g_feedback or controller.enable_overrides:
            raise ValueError("the compiled controller implements tep-studio's defaults only (composition trims on)")
        reg, schema, sp = controller.registry, controller.schema, controller.setpoints
        nominal = reg.nominal
        positional = (
            reg.production,
            reg.reactor_level,
            reg.reactor_pressure,
            reg.reactor_temperature,
            reg.separator_level,
            reg.separator_temperature,
            reg.stripper_level,
            reg.pct_g,
        )
        if len(reg.feed_loops) != NUM_FEED:
            raise ValueError(f"the compiled controller expects {NUM_FEED} feed loops, got {len(reg.feed_loops)}")
        self.specs = tuple(reg.feed_loops) + positional + (reg.ya, reg.yac)

        def meas(name: str) -> int:
            return schema.index("measurements", name)

        def mv(name: str) -> int:
            return schema.index("manipulated_variables", name)

        params = np.zeros((NUM_LOOPS, 6), dtype=np.float64)
        for i, spec in enumerate(self.specs):
            params[i] = (spec.kc, spec.ti_hours, spec.ts_hours, spec.hi, spec.lo, meas(spec.pv) if spec.pv else -1)
        self.loop_params = params
        self.scalars = controller_scalars(nominal, sp)
        self.ratios = dict(nominal.ratios)
        self.ints = np.array(
            [
                meas("reactor_feed_A_concentration"),
                meas("reactor_feed_C_concentration"),
                mv(reg.reactor_temperature.drives),
                mv(reg.separator_temperature.drives),
                meas("stripper_underflow"),
                meas("stripper_underflow_G_concentration"),
            ],
            dtype=np.int64,
        )
        keys = ("r1", "r2", "r3", "r4", "r5", "r6", "r7")
        self.feed_ratio = np.array([keys.index(loop.ratio_key) for loop in reg.feed_loops], dtype=np.int64)
        self.feed_mv = np.array([mv(loop.mv) for loop in reg.feed_loops], dtype=np.int64)
        self.static_idx = np.array([mv(name) for name in nominal.static_mv], dtype=np.int64)
        self.static_val = np.array(list(nominal.static_mv.values()), dtype=np.float64)

    def arrays(self, loop_state: np.ndarray, ctl: np.ndarray) -> tuple:
        """The controller as :func:`control_action` takes it, with the memories ``loop_state`` and ``ctl``."""
        return (
            self.loop_params,
            loop_state,
            ctl,
            self.scalars,
            self.ints,
            self.feed_ratio,
            self.feed_mv,
            self.static_idx,
            self.static_val,
        )

    def reset(self, meas: np.ndarray, time: float) -> tuple[np.ndarray, np.ndarray]:
        """RickerMultiLoopController.reset: (loop memories, controller memory) for a bumpless start at ``time``."""
        loop_state = np.zeros((NUM_LOOPS, 3), dtype=np.float64)
        for i, spec in enumerate(self.specs):
            velocity = i in (YA, YAC)
            x0 = float(spec.x0)
            loop_state[i, OUTPUT] = 0.0 if velocity else (spec.lo if x0 < spec.lo else spec.hi if x0 > spec.hi else x0)
            loop_state[i, LAST_TIME] = float(time) - spec.ts_hours
        ctl = np.zeros(NUM_CTL, dtype=np.float64)
        ctl[R1], ctl[R4] = self.ratios["r1"], self.ratios["r4"]
        ctl[FP] = self.scalars[FP_BASE]
        ctl[RAMPED_PRODUCTION] = float(meas[self.ints[PROD_PV]])
        ctl[RAMPED_PCT_G] = float(meas[self.ints[PCTG_PV]])
        ctl[RAMP_TIME] = float(time)
        return loop_state, ctl


class PlantDiverged(RuntimeError):
    """Fixed-step RK4 left the finite numbers (as tep-studio's ``advance`` reports it)."""


class CompiledPlant:
    """A tep-studio plant in a mode under Ricker's controller, advanced by :func:`run_control`.

    ``sim`` is the ``TennesseeEastmanProcess`` whose native model is advanced; its ``state``/``time`` are brought
    up to date before every snapshot. ``memories()`` and ``set_memories()`` carry the controller (loop memories,
    controller memory, last measurements) across snapshots.
    """

    def __init__(self, mode: str, kernel_seed: int, control_interval: float, ms_flag: int) -> None:
        from tep_studio import RickerMultiLoopController, TennesseeEastmanProcess
        from tep_studio.simulation.modes import mode_setpoints

        self.mode = mode
        self.control_interval = float(control_interval)
        self.sim = TennesseeEastmanProcess(ms_flag=ms_flag)
        if self.sim.solver_method != "RK4":
            raise ValueError("the compiled loop integrates with tep-studio's default fixed-step RK4 only")
        meas, _ = self.sim.reset(mode=mode, seed=float(kernel_seed))
        self.table = ControllerTable(RickerMultiLoopController(setpoints=mode_setpoints(mode)))
        self.loop_state, self.ctl = self.table.reset(meas, self.sim.time)
        self.meas = np.ascontiguousarray(meas, dtype=np.float64)
        self.state = self.sim.state.copy()
        self.clock = np.array([self.sim.time], dtype=np.float64)
        self.action = np.zeros(12, dtype=np.float64)
        self.functions = native_functions()

    @property
    def time(self) -> float:
        return float(self.clock[0])

    def run(
        self, idv: np.ndarray, skip: int, count: int, per_sample: int, meas_idx: np.ndarray, mv_idx: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        """``skip`` control intervals, then ``count`` samples every ``per_sample`` intervals: ``(rows, shutdown)``,
        ``rows`` (count, len(meas_idx) + len(mv_idx)) float64 (rows after a shutdown are left unset)."""
        from tep_studio.simulation.native import ffi

        idv_in = np.ascontiguousarray(idv, dtype=np.float64)
        out = np.empty((count, len(meas_idx) + len(mv_idx)), dtype=np.float64)
        handle = int(ffi.cast("uintptr_t", self.sim.kernel._handle))
        sampling = (
            int(skip),
            int(per_sample),
            np.ascontiguousarray(meas_idx, dtype=np.int64),
            np.ascontiguousarray(mv_idx, dtype=np.int64),
        )
        status, done = run_control(
            self.functions,
            handle,
            self.state,
            self.clock,
            self.meas,
            self.action,
            idv_in,
            self.table.arrays(self.loop_state, self.ctl),
            self.control_interval,
            self.sim.fixed_step,
            sampling,
            out,
        )
        self._sync(idv_in)
        if status == DIVERGED:
            raise PlantDiverged(
                f"Fixed-step RK4 integration diverged (control_interval={self.control_interval}, "
                f"fixed_step={self.sim.fixed_step}) at t={self.time:.4f} h"
            )
        return out, status == SHUTDOWN

    def _sync(self, idv: np.ndarray) -> None:
        """Bring the Python side of ``sim`` (state, time, last inputs) up to the compiled loop's."""
        self.sim.state = self.state.copy()
        self.sim.time = self.time
        kernel = self.sim.kernel
        kernel.state, kernel.time = self.state.copy(), self.time
        kernel.xmv, kernel.idv = self.action.copy(), idv.copy()

    def shutdown_message(self) -> str:
        code, message = self.sim.kernel.shutdown_status()
        return message.strip() or f"code {code}"

    def snapshot(self):
        """(native snapshot, controller memories, last measurements), as :class:`ControlledPlant` has them."""
        return self.sim.snapshot(), (self.loop_state.copy(), self.ctl.copy(), self.action.copy()), self.meas.copy()

    def restore(self, plant, memories, meas: np.ndarray) -> None:
        self.sim.restore(plant)
        self.state = plant.state.copy()
        self.clock[0] = float(plant.time)
        loop_state, ctl, action = memories
        self.loop_state, self.ctl, self.action = loop_state.copy(), ctl.copy(), action.copy()
        self.meas = np.ascontiguousarray(meas, dtype=np.float64).copy()
