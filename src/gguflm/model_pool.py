"""Several models behind one server: ``ModelPool`` maps the names clients give to models that
are loaded on first use and unloaded when idle.

Policy (docs/server.md, "Several models"): a model is loaded by the first request that names
it and stays while it is used; once idle it is unloaded after its time to live (``ttl``, or
the request's own ``keep_alive``), or sooner when another model needs its room. Room is
counted in estimated bytes (``estimate_bytes``: the file, which is memory-mapped and ends up
resident, plus the whole KV cache arena and a working margin) against a budget, and in
models against ``max_loaded``. Only idle models are evicted, the least recently used first;
a request that needs the room of a busy one marks it draining (no new requests start on
it) and waits until it is idle. A model whose estimate alone is over the budget is refused
at once, before anything is allocated.

Each loaded model has its own ``LLM`` (one engine, its own thread and KV cache), so requests
to different models run side by side; a model's results are the same whichever others are
loaded or running.
"""

from __future__ import annotations

import contextvars
import dataclasses
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ModelPool", "ModelSpec", "PoolError", "Held", "PoolScope", "estimate_bytes",
           "available_memory", "WORK_MARGIN"]

# What an engine holds beyond its weights and KV cache (activations, logits, the team's
# per-thread blocks, a prompt batch): measured about 10-30 MiB on SmolLM2 and Gemma 3 270M
# after long prompts; counted generously so that the estimate stays an upper bound.
WORK_MARGIN = 64 * 2**20
# how long a request waits for room (busy models to finish) before a 503
ROOM_WAIT_SECONDS = 300.0


class PoolError(Exception):
    """A request the pool cannot serve: HTTP ``status``, OpenAI-style ``code``."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(frozen=True)
class ModelSpec:
    """A model the server can load: the ``name`` clients use (and ``aliases``), its file,
    the ``LLM`` keyword arguments it loads with (``options``: n_ctx, parallel,
    chat_template, threads, ...), and its idle time to live in seconds (None: the pool's;
    negative: never unloaded for idleness)."""

    name: str
    path: Path
    options: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    ttl: float | None = None


def available_memory() -> int:
    """Bytes this machine can give now (``MemAvailable``), else its physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def estimate_bytes(spec: ModelSpec) -> int:
    """Memory ``spec`` takes once loaded, at most: its file (mapped, and read whole by the
    first tokens), its KV cache arena at full size (``n_ctx`` x ``parallel`` as the engine
    sizes it: ``Model.new_arena``, whose pages are only reserved, not committed, until
    written), a recurrent model's state snapshots, and ``WORK_MARGIN``. Opens the file's
    metadata only (errors as the loader gives them: a bad file is found here)."""
    from .engine.scheduler import DEFAULT_SLOTS, default_n_ctx
    from .model import load_model
    from .model.kv_cache import MAX_CHECKPOINTS, ArenaTooLargeError

    model = load_model(spec.path, spec.options.get("kv_overrides"),
                       spec.options.get("rope_style"))
    try:
        kv_type = spec.options.get("kv_cache_type") or "f16"
        model.use_kv_type(kv_type)
        n_ctx = spec.options.get("n_ctx")
        n_train = int(model.config.n_ctx_train or 0)
        if not n_ctx:
            n_ctx = n_train if n_ctx == 0 and n_train else default_n_ctx(n_train)
        slots = spec.options.get("parallel") or DEFAULT_SLOTS
        try:
            arena = model.new_arena(n_ctx, slots)
        except ArenaTooLargeError as e:
            raise PoolError(503, f"model '{spec.name}' cannot be loaded on this machine: {e}",
                            "model_too_large") from None
        size = arena.nbytes
        if arena.recurrent is not None:
            size += MAX_CHECKPOINTS * arena.recurrent.slot_bytes * slots
        del arena
        files = [model.gguf.path, *(s.path for s in getattr(model.gguf, "shards", ()))]
        return sum(Path(p).stat().st_size for p in files) + size + WORK_MARGIN
    finally:
        model.gguf.close()


@dataclass(eq=False)
class _Resident:
    """A model in memory (or being loaded): its LLM once ``ready``, the requests using it,
    when it was last used and when it expires (monotonic seconds; None: never)."""

    spec: ModelSpec
    nbytes: int
    llm: Any = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires: float | None = None
    loaded_at: float = field(default_factory=time.time)  # wall clock, for listings
    draining: bool = False  # a request waits for its room: start nothing new on it
    unload_asked: bool = False  # /models/unload while in use: unload once idle


class Held:
    """The models one HTTP request uses (``PoolScope`` gives each request one) and the
    model its handler picked (``llm``)."""

    def __init__(self) -> None:
        self.residents: list[_Resident] = []
        self.llm: Any = None
        self.keep_alive: float | None = None  # seconds the request asks to keep its model
        self._lock = threading.Lock()
        self._done = False

    def take(self, pool: ModelPool, name: str | None) -> _Resident:
        """``pool.acquire(name)``, held by this request (blocks: run it in a thread). A
        request that ended meanwhile (its client left) gives the model back at once."""
        r = pool.acquire(name)
        with self._lock:
            if not self._done:
                self.residents.append(r)
                return r
        pool.release(r, None)
        raise PoolError(499, "the request ended while its model was loading", "cancelled")

    def release_all(self, pool: ModelPool) -> None:
        """The request has ended: give back every model it held."""
        with self._lock:
            self._done = True
            held, self.residents = self.residents, []
            self.llm = None  # nothing here keeps a model that is unloaded next
        for r in held:
            pool.release(r, self.keep_alive)


CURRENT: contextvars.ContextVar[Held | None] = contextvars.ContextVar("gguflm_held",
                                                                      default=None)


class PoolScope:
    """ASGI middleware: each request gets a ``Held``; the models it used are released when
    its answer has been sent (a stream: when it ended or the client left)."""

    def __init__(self, app: Any, pool: ModelPool) -> None:
        self.app, self.pool = app, pool

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        held = Held()
        token = CURRENT.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT.reset(token)
            held.release_all(self.pool)


class ModelPool:
    """The models a server can serve (``specs``), loaded by ``load(spec)`` on first use.

    ``budget`` bytes (estimated, ``estimate``) and ``max_loaded`` models (None: no limit)
    bound what is loaded at once; ``ttl`` is the idle seconds before a model is unloaded
    (negative: never). ``close(llm)`` releases an unloaded model. A pool made by ``single``
    serves one model that is always loaded, under any name."""

    def __init__(self, specs: Iterable[ModelSpec], load: Callable[[ModelSpec], Any], *,
                 budget: int | None = None, max_loaded: int | None = None,
                 ttl: float = 300.0, estimate: Callable[[ModelSpec], int] = estimate_bytes,
                 log: Callable[[str], None] = lambda message: None) -> None:
        self._specs = list(specs)
        if not self._specs:
            raise ValueError("no models to serve")
        self._load, self.log = load, log
        self.budget = available_memory() if budget is None else budget
        self.max_loaded, self.ttl = max_loaded, ttl
        self._names: dict[str, ModelSpec] = {}
        for spec in self._specs:
            for name in (spec.name, *spec.aliases):
                if name in self._names:
                    raise ValueError(f"the model name '{name}' is given twice "
                                     f"({self._names[name].path} and {spec.path})")
                self._names[name] = spec
        self.sizes = {s.name: estimate(s) for s in self._specs}
        self._residents: dict[str, _Resident] = {}
        self._closing = 0  # bytes of models being unloaded (still in memory)
        self._dying: list[tuple[Callable[[], Any], int]] = []  # their models, bytes
        self._cv = threading.Condition()
        self._stop = False
        self.single = False
        self._reaper = threading.Thread(target=self._reap, name="gguflm-models", daemon=True)
        self._reaper.start()

    @classmethod
    def single_model(cls, llm: Any) -> ModelPool:
        """A pool of one loaded model that answers to any name and is never unloaded."""
        spec = ModelSpec(llm.model_id, Path(llm.model_path), ttl=-1.0)
        pool = cls([spec], lambda s: llm, budget=0, estimate=lambda s: 0)
        pool.single = True
        r = _Resident(spec, 0, llm)
        r.ready.set()
        pool._residents[spec.name] = r
        return pool

    @property
    def default_llm(self) -> Any:
        """A single-model pool's model."""
        return self._residents[self._specs[0].name].llm

    # --- names ------------------------------------------------------------------------------

    @property
    def specs(self) -> list[ModelSpec]:
        """The models that can be served (a single model under its LLM's id now: the
        caller may rename it)."""
        if self.single:
            return [dataclasses.replace(self._specs[0], name=self.default_llm.model_id)]
        return list(self._specs)

    @property
    def default(self) -> ModelSpec:
        """The model of a request that names none: the first one given."""
        return self.specs[0]

    def spec(self, name: str | None) -> ModelSpec:
        """The model ``name`` (a name or alias; ollama's ``:latest`` and a ``.gguf`` suffix
        may be left out or added); PoolError 404 listing what is served."""
        if self.single or name is None or name == "":
            return self.default
        for candidate in (name, name.removesuffix(":latest"), name + ".gguf",
                          name.removesuffix(":latest") + ".gguf"):
            if candidate in self._names:
                return self._names[candidate]
        raise PoolError(404, f"model '{name}' is not served here; models: "
                        f"{', '.join(sorted(self._names))}", "model_not_found")

    # --- using a model ----------------------------------------------------------------------

    def acquire(self, name: str | None) -> _Resident:
        """The loaded model ``name`` with one more user (release it with ``release``):
        loaded now if it is not, after making room (PoolError 503 when it can never fit, or
        when the room is not free within ROOM_WAIT_SECONDS). Blocks: call it in a thread."""
        spec = self.spec(name)
        victims: list[_Resident] = []
        with self._cv:
            r, created = self._wait_for(spec, victims)
            r.users += 1
            r.last_used = time.monotonic()
        if created:  # this request loads it; others for it wait on ``ready``
            if victims:
                self._close_all(victims)
            self._load_into(r)
        r.ready.wait()
        if r.error is not None:
            self.release(r, None)
            raise PoolError(500, f"model '{spec.name}' failed to load: {r.error}",
                            "model_load_failed")
        return r

    def _wait_for(self, spec: ModelSpec, victims: list[_Resident]
                  ) -> tuple[_Resident, bool]:
        """(Holding the lock.) ``spec``'s resident and whether it is new (not loaded: the
        caller loads it, after unloading the ``victims`` this adds, which made room)."""
        need = self.sizes[spec.name]
        if need > self.budget:
            raise PoolError(503, f"model '{spec.name}' needs about {_mib(need)} (its file, "
                            f"a KV cache of its n_ctx x parallel, and a working margin), "
                            f"more than the memory budget of {_mib(self.budget)} "
                            "(--mem-budget)", "model_too_large")
        deadline = time.monotonic() + ROOM_WAIT_SECONDS
        marked: list[_Resident] = []
        try:
            while True:
                r = self._residents.get(spec.name)
                if r is not None and not r.draining:
                    return r, False
                if r is None:
                    plan = self._room_plan(need)
                    if plan is not None and all(v.users == 0 and v.ready.is_set()
                                                for v in plan):
                        for v in plan:
                            self._evict(v)
                        victims.extend(plan)
                        r = _Resident(spec, need)
                        self._residents[spec.name] = r
                        return r, True
                    for v in plan or ():
                        if not v.draining:
                            v.draining = True
                            marked.append(v)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolError(503, f"model '{spec.name}' cannot be loaded now: the "
                                    f"models in use ({', '.join(self._busy())}) hold the "
                                    f"memory budget ({_mib(self.budget)}) or --max-loaded; "
                                    "retry later", "models_busy")
                self._cv.wait(min(left, 1.0))
        finally:
            for v in marked:  # waited on, and now evicted or given up on
                v.draining = False

    def _room_plan(self, need: int) -> list[_Resident] | None:
        """The models to unload, least recently used first, so that ``need`` more bytes and
        one more model fit; None when even unloading every loaded one would not do."""
        used = sum(r.nbytes for r in self._residents.values()) + self._closing
        count = len(self._residents)
        plan: list[_Resident] = []
        candidates = sorted((r for r in self._residents.values() if r.ready.is_set()),
                            key=lambda r: (r.users > 0, r.last_used))
        for r in candidates:
            if used + need <= self.budget and (self.max_loaded is None
                                               or count < self.max_loaded):
                return plan
            plan.append(r)
            used -= r.nbytes
            count -= 1
        fits = used + need <= self.budget and (self.max_loaded is None
                                               or count < self.max_loaded)
        return plan if fits else None

    def _busy(self) -> list[str]:
        return [r.spec.name for r in self._residents.values() if r.users] or ["loading"]

    def _load_into(self, r: _Resident) -> None:
        """Load ``r``'s model (outside the lock); a failure leaves it unloaded."""
        t0 = time.perf_counter()
        try:
            llm = self._load(r.spec)
        except BaseException as e:  # noqa: BLE001 - every waiter must hear of it
            with self._cv:
                r.error = e
                if self._residents.get(r.spec.name) is r:
                    del self._residents[r.spec.name]
                self._cv.notify_all()
            r.ready.set()
            return
        with self._cv:
            r.llm = llm
            r.loaded_at = time.time()
            self._cv.notify_all()
        r.ready.set()
        self.log(f"loaded {r.spec.name} in {time.perf_counter() - t0:.1f} s "
                 f"({_mib(r.nbytes)} estimated)")

    def release(self, r: _Resident, keep_alive: float | None) -> None:
        """One user of ``r`` is done; it expires ``keep_alive`` seconds from now (None: its
        ttl; negative: never; 0: as soon as it is idle)."""
        with self._cv:
            r.users -= 1
            now = time.monotonic()
            r.last_used = now
            keep = keep_alive if keep_alive is not None else (
                r.spec.ttl if r.spec.ttl is not None else self.ttl)
            r.expires = now if r.unload_asked else None if keep < 0 else now + keep
            self._cv.notify_all()

    # --- loading and unloading by hand (/models/load, /models/unload) ------------------------

    def load(self, name: str) -> None:
        """Load ``name`` now (as a request would), leaving it idle."""
        self.release(self.acquire(name), None)

    def unload(self, name: str) -> bool:
        """Unload ``name``: now if idle, else as soon as its requests end. False when it
        was not loaded."""
        spec = self.spec(name)
        with self._cv:
            r = self._residents.get(spec.name)
            if r is None or self.single:
                return False
            r.expires, r.unload_asked = time.monotonic(), True
            if r.users or not r.ready.is_set():
                self._cv.notify_all()
                return True
            self._evict(r)
        self._close_all([r])
        return True

    def _evict(self, r: _Resident) -> None:
        """(Holding the lock.) Take ``r`` out; its bytes count until ``_close_all``."""
        del self._residents[r.spec.name]
        self._closing += r.nbytes

    def _close_all(self, gone: list[_Resident]) -> None:
        """Close the models of ``gone`` (evicted); their bytes stay counted until their
        memory is really free (``_settle``)."""
        for r in gone:
            llm, r.llm = r.llm, None
            if llm is not None:
                llm.close()
                self._dying.append((weakref.ref(llm.model), r.nbytes))
                self.log(f"unloaded {r.spec.name}")
            else:
                self._dying.append((lambda: None, r.nbytes))
            del llm
        self._settle()

    def _settle(self) -> None:
        """Free what unloaded models left (an LLM's parts refer to each other: only the
        collector frees them, and a model's file stays mapped while any of its arrays
        lives); the bytes of those now gone stop counting. A model still referred to (the
        last request's objects, about to go) is looked at again by the pool's thread."""
        gc.collect()
        _trim_heap()
        with self._cv:
            alive = [(ref, n) for ref, n in self._dying if ref() is not None]
            self._closing -= sum(n for _, n in self._dying) - sum(n for _, n in alive)
            self._dying = alive
            self._cv.notify_all()

    def _reap(self) -> None:
        """Unload idle models whose time is up (the pool's own thread)."""
        while True:
            with self._cv:
                if self._stop:
                    return
                now = time.monotonic()
                due = [r for r in self._residents.values() if r.users == 0
                       and r.ready.is_set() and r.expires is not None and r.expires <= now]
                for r in due:
                    self._evict(r)
                if not due:
                    waits = [r.expires - now for r in self._residents.values()
                             if r.expires is not None]
                    if self._dying:
                        waits.append(0.2)
                    self._cv.wait(min([1.0, *waits]))
                dying = bool(self._dying)
            if due:
                self._close_all(due)
            elif dying:
                self._settle()

    def close(self) -> None:
        """Unload everything and stop the pool's thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            if self.single:  # its one model belongs to whoever made the server
                return
            gone = list(self._residents.values())
            self._residents.clear()
        for r in gone:
            if r.llm is not None:
                r.llm.close()

    # --- what is loaded ---------------------------------------------------------------------

    def loaded(self) -> list[tuple[ModelSpec, Any, float | None, float]]:
        """(spec, LLM, expiry as wall-clock seconds or None, loaded-at) of each loaded
        model, most recently used first."""
        with self._cv:
            now, wall = time.monotonic(), time.time()
            out = []
            for r in sorted(self._residents.values(), key=lambda r: -r.last_used):
                if r.llm is None:
                    continue
                idle_until = (None if r.expires is None or r.users
                              else wall + max(0.0, r.expires - now))
                spec = self.specs[0] if self.single else r.spec
                out.append((spec, r.llm, idle_until, r.loaded_at))
        return out

    def state(self, name: str) -> str:
        """``loaded``, ``loading`` or ``unloaded`` (llama-server's router words)."""
        with self._cv:
            r = self._residents.get(name)
            if r is None:
                return "unloaded"
            return "loaded" if r.llm is not None else "loading"


def _trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc's ``malloc_trim``): an unloaded
    model's buffers were allocated by threads of their own, and glibc keeps what such
    threads free in their arenas, where the RSS would keep counting it."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    if _LIBC and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


_LIBC: Any = None


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
