"""clattn's devices, the library's notices, and the plans' cache (what every module holds its plans in)."""
from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _arrays as _a
from . import _lib
from ._errors import (BuildFailureError, DeviceAllocationError, Error, InvalidArgumentError, InvalidDeviceSpecError,
                      NoDeviceError, OpenCLError, OutOfHostMemoryError, ShapeMismatchError, SizeOverflowError,
                      TooLargeForDeviceError, UnsupportedError)
from ._errors import check as _check
from ._errors import invalid as _invalid
from ._errors import shape as _shape

logger = logging.getLogger("clattn")


# ---------------------------------------------------------------- notices from the library

_noticed_devices = set()
_noticed_cache = [""]
_noticed_plans = set()


@_lib.BuildNoticeFn
def _build_notice(device_name, user):  # called by the library, from the thread creating a plan
    try:
        name = (device_name or b"").decode(errors="replace")
        if name not in _noticed_devices:
            _noticed_devices.add(name)
            logger.warning("compiling OpenCL kernels for %s (the first time for this device and clattn "
                           "version; later runs load them from the kernel cache)", name)
    except Exception:  # never let a notice raise into C
        pass


_lib.set_build_notice(_build_notice, None)


def _cache_notice():
    n = (_lib.kernel_cache_notice() or b"").decode(errors="replace")
    if n and n != _noticed_cache[0]:
        _noticed_cache[0] = n
        logger.warning("the kernel cache was not used: %s", n)


def version() -> str:
    """The version of the libclattn this package loaded."""
    return _lib.version().decode()


def devices(verbose: bool = False) -> List[Dict[str, Any]]:
    """Every device clattn can open: ref first, then each OpenCL device, as dicts (selector, platform, name,
    type, compute_units, global_mem_bytes, max_alloc_bytes, opencl_c_version, fp16, fp64). verbose: each OpenCL
    device is opened and its dict gets "facts", what clattn knows of it (clattn_device_facts, as `clattn devices
    -v` prints them): its class and driver, the capabilities read, and what its probes measured ("loop limit",
    "nan and inf arithmetic", "profiling timestamps", "probe notes"), names to strings."""
    n = ctypes.c_size_t(0)
    _check(_lib.device_list(None, 0, ctypes.byref(n)), "listing devices")
    infos = (_lib.DeviceInfo * max(n.value, 1))()
    _check(_lib.device_list(infos, n.value, ctypes.byref(n)), "listing devices")
    out = [dict(selector="ref", platform="", name="CPU reference (plain C)", type="cpu", compute_units=1,
                global_mem_bytes=0, max_alloc_bytes=0, opencl_c_version="", fp16=False, fp64=True)]
    for d in infos[:n.value]:
        out.append(dict(selector=d.selector.decode(), platform=d.platform.decode(), name=d.name.decode(),
                        type=d.type.decode(), compute_units=d.compute_units, global_mem_bytes=d.global_mem_bytes,
                        max_alloc_bytes=d.max_alloc_bytes, opencl_c_version=d.opencl_c_version.decode(),
                        fp16=bool(d.fp16), fp64=bool(d.fp64)))
    for d in out[1:] if verbose else []:
        dev = _Device(d["selector"])  # held while its facts are read
        text = _lib.device_facts(dev.handle).decode(errors="replace")
        d["facts"] = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return out


def cores(device: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every core clattn has, as `clattn cores --json` lists them on `device` (a spec as for devices(); None: the
    default device): dicts with name, kind ("prefill", "decode", "gemm": the matrix products, or
        "backward": a training plan's attention backward), supported,
    emulated (forcing it runs an emulation here, for tests), reason (why not, "" when supported), default_for (the
    head-size classes, "<=32" ... ">256", whose plans AUTO gives it there), algorithm (None for GEMM cores),
    weights, params and test_configs. CLATTN_CORE=NAME[:P=V,...][;NAME...] in the environment forces cores (one
    per kind) on the plans that can use them."""
    dev = _Device(device)
    out = []
    for i in range(_lib.core_count()):
        c = _lib.CoreInfo()
        _check(_lib.core_describe(dev.handle, i, ctypes.byref(c)), "describing the cores")
        out.append(dict(name=c.name.decode(), kind=_lib.CORE_KINDS[c.kind], supported=bool(c.supported),
                        emulated=bool(c.emulated), reason=c.reason.decode(),
                        default_for=[_lib.head_class_label(k).decode() for k in range(_lib.HEAD_CLASS_COUNT)
                                     if c.default_for & (1 << k)],
                        algorithm=None if c.kind == _lib.CORE_GEMM else {1: "fused", 2: "unfused"}.get(c.algorithm, "auto"),
                        weights=bool(c.produces_weights), reads_dtypes=bool(c.reads_dtypes),
                        params=c.params.decode().split(), test_configs=c.test_configs.decode().split()))
    return out


def selftest(device: Optional[str] = None, quick: bool = False) -> List[Dict[str, Any]]:
    """Run clattn's self-test on `device` (an OpenCL device spec as for devices(); None: the default device), as
    `clattn selftest` does: every core the device runs, forced in turn, on a compact conformance set against the CPU
    reference. One dict per core: core, kind, cases, refused (cases the core refused with the device's limit named),
    worst_error, worst_ratio (of the tolerance: at most 1 passes), verdict ("pass", "fail": a wrong number, "error":
    a case ended in an error that is not a refusal, "not run") and detail (the first failure, why it did not run, or
    the first refusal). The failures are kept with the device's probes: AUTO then passes over a core that failed on
    this device and driver (a full run replaces them, a quick one adds). The first thing to run on a new device."""
    dev = _Device(device)
    n = ctypes.c_size_t(0)
    res = (_lib.SelftestResult * _lib.core_count())()
    _check(_lib.device_selftest(dev.handle, int(bool(quick)), res, len(res), ctypes.byref(n)), "the self-test")
    return [dict(core=r.core.decode(), kind=_lib.CORE_KINDS[r.kind], cases=r.cases, refused=r.refused,
                 worst_error=r.worst_error, worst_ratio=r.worst_ratio, verdict=_lib.VERDICTS[r.verdict],
                 detail=r.detail.decode(errors="replace")) for r in res[:min(n.value, len(res))]]


class _Device:
    """An open clattn device (freed with the object)."""

    def __init__(self, spec: Optional[str]):
        if spec is not None and not isinstance(spec, str):
            _invalid(f"device: {spec!r}, expected a device spec string (see clattn.devices()) or None")
        self.handle = ctypes.c_void_p()
        _check(_lib.device_open(spec.encode() if spec else None, ctypes.byref(self.handle)),
               f"opening device {spec!r}")
        self.name = _lib.device_name(self.handle).decode()
        self.backend = "opencl" if _lib.device_backend(self.handle) == _lib.BACKEND_OPENCL else "ref"

    def __del__(self):
        if getattr(self, "handle", None):
            _lib.device_free(self.handle)
            self.handle = None


class _Handle:
    """A library object (plan, decode plan, KV cache), freed when the last reference goes. lock: held by a call that
    sets the plan's per-call state (_plan_state) until it has run."""

    def __init__(self, handle, free, device):
        self.handle, self._free, self._device = handle, free, device  # the device outlives its plans
        self.lock = threading.Lock()

    def __del__(self):
        if getattr(self, "handle", None):
            self._free(self.handle)
            self.handle = None


@contextlib.contextmanager
def _plan_state(plan: "_Handle", seed: Optional[int] = None, weights: Optional["_lib.AttentionWeights"] = None):
    """The plan's state for one call, set on entry: the dropout seed (clattn_plan_set_seed), weights (the sinks of
    a functional call: clattn_plan_set_weights); None: leave it. The library takes one call on a plan at a time, but
    setting the state and running are two calls, and the plans of a shape are shared between threads: the plan's
    lock is held from the first to the end of the with block, so that another thread's seed or sinks never reach
    this call. Nothing to set: no lock (the library's own does)."""
    if seed is None and weights is None:
        yield plan
        return
    with plan.lock:
        if seed is not None:
            _check(_lib.plan_set_seed(plan.handle, seed), "setting the dropout seed")
        if weights is not None:
            _check(_lib.plan_set_weights(plan.handle, ctypes.byref(weights)), "setting the sinks")
        yield plan


def _create(device: "_Device", create, free, desc, weights, what: str) -> "_Handle":
    """A library object from create(device, &desc, &weights, &handle), freed with free; the kernel cache's notice
    (if any) reported whatever happened, and the plan's own (clattn_last_notice) once per text."""
    handle = ctypes.c_void_p()
    try:
        _check(create(device.handle, ctypes.byref(desc), ctypes.byref(weights), ctypes.byref(handle)), what)
    finally:
        _cache_notice()
    note = (_lib.last_notice() or b"").decode(errors="replace")
    if note and note not in _noticed_plans:  # what the plan was asked for and does not do (CLATTN_CORE), once
        _noticed_plans.add(note)
        logger.warning("%s", note)
    return _Handle(handle, free, device)


class _PlanCache:
    """The plans of one module, per input shape, least recently used first out."""

    def __init__(self, size: int):
        self.size = size
        self._plans: "collections.OrderedDict[tuple, _Handle]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, make, refresh=None):
        """The plan for key: the cached one (after refresh(plan), when given), else make()'s."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                if refresh is not None:
                    refresh(plan)
                return plan
            plan = make()
            if self.size:
                self._plans[key] = plan
                while len(self._plans) > self.size:
                    self._plans.popitem(last=False)
            return plan

    def resize(self, size: int):
        with self._lock:
            self.size = size
            while len(self._plans) > size:
                self._plans.popitem(last=False)

    def __len__(self):
        return len(self._plans)


class _Shaped:
    """The shape of a module's attention, read-only (from its weights)."""

    _wt: "_Weights"
    heads = property(lambda self: self._wt.heads, doc="Query heads H.")
    kv_heads = property(lambda self: self._wt.kv_heads, doc="Key/value heads (= heads unless grouped-query).")
    layout = property(lambda self: self._wt.layout, doc='"linear" or "raw".')
    embed = property(lambda self: self._wt.embed, doc="The input width w_query takes (None without weights).")
    head_dim_qk = property(lambda self: self._wt.head_dim_qk, doc="Query/key head size (None without weights).")
    head_dim_v = property(lambda self: self._wt.head_dim_v, doc="Value head size (None without weights).")
    out_dim = property(lambda self: self._wt.out_dim, doc="Rows of w_out (0 without an output projection).")


class _PlanCached:
    """The plan cache's knobs, shared by the modules that make a plan per input shape."""

    _plans: _PlanCache

    @property
    def plan_cache_size(self) -> int:
        """How many input shapes keep their plan (least recently used out); settable (0 keeps none)."""
        return self._plans.size

    @plan_cache_size.setter
    def plan_cache_size(self, n: int) -> None:
        self._plans.resize(_a.integer("plan_cache_size", n))

    @property
    def plans_cached(self) -> int:
        """How many plans the module holds now."""
        return len(self._plans)
