"""The original package's forms of the seven serving blueprints: its spawns and handles.

The original package (``atomr_accel`` 0.10, built with PyO3) offered each
serving blueprint on built-in demo models only (``_pattern_models``), as
``Blueprint.spawn(system, <settings>)`` and blocking methods taking
``timeout_secs``. This module attaches that form to each blueprint's
``spawn`` (``attach_spawn``): given no model, and arguments that fit the
original's, it starts the blueprint on the demo model and returns this
module's handle, whose methods are the original's. ``HotSwapServer`` is the
original's name of ``ModelHotSwapServer``.
"""

from __future__ import annotations

import numbers
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

import numpy as np

from atomr_accel.actor import ActorError, InvalidActorName
from atomr_accel.actor import AskTimeout as ActorAskTimeout
from atomr_accel.actor import SystemClosed as ActorSystemClosed
from atomr_accel.blueprint import (
    BlueprintClient,
    SystemLike,
    require_positive_int,
    require_timeout,
    require_wait,
    twin,
)
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, gpu_error_of
from atomr_accel.facade import System
from atomr_accel.original._forms import attach_spawn, is_models
from atomr_accel.original._pattern_models import (
    BiasExpert,
    LinearGate,
    VersionTag,
    draft_next,
    echo,
    echo_batch,
    echo_stage,
    verify_next,
)
from atomr_accel.patterns._batching import DynamicBatchingServer
from atomr_accel.patterns._cascade import InferenceCascade, Stage
from atomr_accel.patterns._fair_share import FairShareScheduler
from atomr_accel.patterns._hot_swap import ModelHotSwapServer
from atomr_accel.patterns._moe import MoeRouter
from atomr_accel.patterns._replica_pool import ModelReplicaPool
from atomr_accel.patterns._speculative import SpeculativeDecoder

__all__ = [
    "HotSwapServer",
    "OriginalDynamicBatchingServer",
    "OriginalFairShareScheduler",
    "OriginalHandle",
    "OriginalHotSwapServer",
    "OriginalInferenceCascade",
    "OriginalModelReplicaPool",
    "OriginalMoeRouter",
    "OriginalSpeculativeDecoder",
]

T = TypeVar("T")
C = TypeVar("C", bound=BlueprintClient)
Array = np.ndarray[Any, Any]
BytesLike: TypeAlias = bytes | bytearray | memoryview
TIMEOUT = 5.0
"""The original's ``timeout_secs`` default, seconds."""


# ------------------------------------------------------------------- argument checks


def _payload(name: str, value: object) -> bytes:
    """``value`` as bytes: a bytes-like object or a sequence of ints in 0..255 (as the
    original's ``Vec<u8>`` took); ``InvalidArgument`` for anything else."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, int | str) and isinstance(value, Iterable):
        try:
            return bytes(value)
        except (TypeError, ValueError):
            pass
    raise InvalidArgument(f"{name} must be bytes-like (bytes, bytearray, memoryview) or a "
                          f"sequence of ints in 0..255, got {value!r:.60}")


def _token(name: str, value: object) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def _vector(value: object) -> Array:
    try:
        vector = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgument(f"input must be a list of numbers, got {value!r}") from None
    if vector.ndim != 1:
        raise InvalidArgument(f"input must be one vector (a list of numbers), "
                              f"got shape {vector.shape}")
    return vector


def _system(system: object) -> System:
    """``system`` if it is a facade ``System`` (``InvalidArgument`` otherwise)."""
    if not isinstance(system, System):
        raise InvalidArgument(f"the original package's form runs in a System (System.open), "
                              f"got {type(system).__name__}; give a model for the "
                              "blueprint's own form")
    return system


def _typed(exc: ActorError, system: str, what: str) -> GpuRuntimeError:
    """The typed error for the actor runtime's ``exc`` in the original's forms."""
    if isinstance(exc, InvalidActorName):
        return InvalidArgument(str(exc))
    return gpu_error_of(exc, system, what)


def _start(system: System, name: object, spawn: Callable[..., C], *args: Any,
           **settings: Any) -> C:
    """Return ``spawn(system, *args, name=name, **settings)``: the blueprint's own form.

    A bad or taken ``name`` is an ``InvalidArgument``; a closed system raises
    ``SystemClosed``.
    """
    if name is not None and not isinstance(name, str):
        raise InvalidArgument(f"name must be a str or None, got {name!r}")
    try:
        return spawn(system, *args, name=name, **settings)
    except (InvalidActorName, ActorSystemClosed) as exc:
        raise _typed(exc, system.name, "spawn") from exc


# ------------------------------------------------------------------------ the handles


class OriginalHandle(Generic[C]):
    """Base of the original package's pattern handles: its methods over a blueprint client.

    Each method is written once as ``name_async``, which checks its arguments
    when called and returns a coroutine to await on any event loop; ``name``
    is its blocking twin, for any thread, also inside a running event loop
    other than the system's. Every method takes ``timeout_secs`` (default 5 s,
    its last positional parameter): past it the call raises ``AskTimeout``;
    after ``System.close`` it raises ``SystemClosed``; bad arguments raise
    ``InvalidArgument``. Get one from the blueprint's ``spawn`` in the
    original's form.
    """

    def __init__(self, client: C, system: System) -> None:
        self._client = client
        self._portal = system._portal
        self._system = system.name

    @property
    def client(self) -> C:
        """The blueprint's own async client underneath (``stats()``, ``stop()``, ...)."""
        return self._client

    async def _run(self, what: str, method: Callable[..., Awaitable[T]], *args: Any,
                   **kwargs: Any) -> T:
        """Return ``await method(*args, **kwargs)``, the actor runtime's time-out and
        closed-system errors as ``AskTimeout`` and ``SystemClosed``."""
        try:
            return await method(*args, **kwargs)
        except GpuRuntimeError:
            raise
        except (ActorAskTimeout, ActorSystemClosed) as exc:
            raise _typed(exc, self._system, what) from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._client.path})"


class OriginalDynamicBatchingServer(OriginalHandle[DynamicBatchingServer]):
    """The original's ``DynamicBatchingServer``: batches payloads for the echo batch function."""

    def submit_async(self, payload: BytesLike, timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, list[int]]:
        """Send ``payload`` through the batcher; the echo answers its bytes as a list of ints."""
        return self._run("submit", self._client.submit_async, _payload("payload", payload),
                         timeout_secs=require_timeout(timeout_secs))

    submit = twin(submit_async)


class OriginalInferenceCascade(OriginalHandle[InferenceCascade]):
    """The original's ``InferenceCascade``: one echo stage answering with confidence 1.0."""

    def infer_async(self, input: BytesLike, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, tuple[list[int], int, float]]:
        """Run ``input`` through the cascade; return ``(answer, stage, confidence)``.

        With the echo stage: ``(list(input), 0, 1.0)``.
        """
        return self._run("infer", self._infer, _payload("input", input),
                         require_timeout(timeout_secs))

    async def _infer(self, data: bytes, timeout: float) -> tuple[list[int], int, float]:
        result = await self._client.infer_async(data, timeout_secs=timeout)
        return result.answer, result.stage, result.confidence

    infer = twin(infer_async)


class OriginalModelReplicaPool(OriginalHandle[ModelReplicaPool]):
    """The original's ``ModelReplicaPool``: echo replicas taken round-robin."""

    def submit_async(self, payload: BytesLike, timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, list[int]]:
        """Send ``payload`` to the next replica; the echo answers its bytes as a list of ints."""
        return self._run("submit", self._client.call_async, _payload("payload", payload),
                         timeout_secs=require_timeout(timeout_secs))

    submit = twin(submit_async)


class OriginalFairShareScheduler(OriginalHandle[FairShareScheduler]):
    """The original's ``FairShareScheduler``: the echo shared between tenants by weight."""

    def __init__(self, client: FairShareScheduler, system: System,
                 tenants: Iterable[int]) -> None:
        super().__init__(client, system)
        self._tenants = frozenset(tenants)

    def submit_async(self, tenant: int, payload: BytesLike, timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, list[int]]:
        """Queue ``payload`` for ``tenant``; the echo answers its bytes as a list of ints.

        A tenant not given to ``spawn`` is an ``InvalidArgument``.
        """
        if (not isinstance(tenant, numbers.Integral) or isinstance(tenant, bool)
                or int(tenant) not in self._tenants):
            raise InvalidArgument(f"unknown tenant {tenant!r}; the tenants are "
                                  f"{sorted(self._tenants)}")
        return self._run("submit", self._client.submit_async, int(tenant),
                         _payload("payload", payload), timeout_secs=require_timeout(timeout_secs))

    submit = twin(submit_async)


class OriginalHotSwapServer(OriginalHandle[ModelHotSwapServer]):
    """The original's ``HotSwapServer``: version-tagged echo models, swapped in turn."""

    def __init__(self, client: ModelHotSwapServer, system: System) -> None:
        super().__init__(client, system)
        self._generation = 0

    def serve_async(self, payload: BytesLike, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, list[int]]:
        """Serve ``payload``: its bytes and the serving model's generation byte (``b"x"``:
        ``[120, 0]`` before any swap)."""
        return self._run("serve", self._client.infer_async, _payload("payload", payload),
                         timeout_secs=require_timeout(timeout_secs))

    def swap_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Swap in the next generation's model; return its generation (1, 2, ...).

        Returns once the old model has drained; every later ``serve`` appends
        the new generation.
        """
        return self._run("swap", self._swap, require_timeout(timeout_secs))

    async def _swap(self, timeout: float) -> int:
        return await self._portal.acall(self._swap_on_loop(timeout))

    async def _swap_on_loop(self, timeout: float) -> int:
        # On the system's loop: nothing suspends between counting the generation and
        # mailing its swap, so generations follow the order the server takes swaps in.
        self._generation += 1
        version = await self._client.swap_async(VersionTag(self._generation),
                                                 timeout_secs=timeout)
        return version - 1

    serve = twin(serve_async)
    swap = twin(swap_async)


class OriginalSpeculativeDecoder(OriginalHandle[SpeculativeDecoder]):
    """The original's ``SpeculativeDecoder``: ``draft_next`` proposes, ``verify_next`` accepts."""

    def __init__(self, client: SpeculativeDecoder, system: System,
                 max_total_tokens: int) -> None:
        super().__init__(client, system)
        self._max_total = max_total_tokens

    def decode_async(self, prompt: Iterable[int], budget: int = 64,
                     timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, tuple[list[int], int, int]]:
        """Decode after ``prompt``; return ``(tokens, iterations, accepted)``.

        ``tokens`` is the prompt and what follows it, at most
        ``min(max_total_tokens, budget)`` tokens; ``iterations`` counts the
        verifier's rounds and ``accepted`` the draft tokens it accepted.
        Tokens are ints >= 0 and ``budget`` an int >= 0 (``InvalidArgument``).
        """
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Iterable):
            raise InvalidArgument(f"prompt must be a list of ints, got {type(prompt).__name__}")
        tokens = [_token("a prompt token", t) for t in prompt]
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise InvalidArgument(f"budget must be an int >= 0, got {budget!r}")
        return self._run("decode", self._decode, tokens, min(self._max_total, budget),
                         require_timeout(timeout_secs))

    async def _decode(self, prompt: list[int], cap: int,
                      timeout: float) -> tuple[list[int], int, int]:
        if len(prompt) >= cap:
            return prompt[:cap], 0, 0
        out = await self._client.generate_async(prompt, max_tokens=cap - len(prompt),
                                               timeout_secs=timeout)
        return [*prompt, *out.tokens], out.verifier_calls, out.accepted

    decode = twin(decode_async)


class OriginalMoeRouter(OriginalHandle[MoeRouter]):
    """The original's ``MoeRouter``: bias experts under a linear gate."""

    def route_async(self, input: Sequence[float], timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, list[float]]:
        """Route the vector ``input`` to its top-k experts; return their weighted output.

        Expert ``i`` adds ``i`` and the last expert wins: ``[1, 2]`` with 3
        experts and ``top_k=1`` gives ``[3.0, 4.0]``.
        """
        return self._run("route", self._route, _vector(input), require_timeout(timeout_secs))

    async def _route(self, vector: Array, timeout: float) -> list[float]:
        routed = await self._client.route_async(vector, timeout_secs=timeout)
        result: list[float] = routed.tolist()
        return result

    route = twin(route_async)


# ------------------------------------------------------------------- the spawn forms


def spawn_batching(spawn: Callable[..., DynamicBatchingServer], system: SystemLike,
                   max_batch: int = 8, max_wait_ms: float = 10, name: str | None = None,
                   ) -> OriginalDynamicBatchingServer:
    """The original's ``DynamicBatchingServer.spawn``: the echo batch function.

    A batch is flushed at ``max_batch`` payloads or ``max_wait_ms`` ms after
    the oldest arrived.
    """
    checked = _system(system)
    require_wait("max_wait_ms", max_wait_ms)
    client = _start(checked, name, spawn, echo_batch, max_batch=max_batch,
                    max_wait=max_wait_ms / 1000)
    return OriginalDynamicBatchingServer(client, checked)


def spawn_cascade(spawn: Callable[..., InferenceCascade], system: SystemLike,
                  name: str | None = None) -> OriginalInferenceCascade:
    """The original's ``InferenceCascade.spawn``: one echo stage at confidence 1.0."""
    checked = _system(system)
    client = _start(checked, name, spawn, [Stage(echo_stage)])
    return OriginalInferenceCascade(client, checked)


def spawn_pool(spawn: Callable[..., ModelReplicaPool], system: SystemLike, n_replicas: int = 2,
               name: str | None = None) -> OriginalModelReplicaPool:
    """The original's ``ModelReplicaPool.spawn``: ``n_replicas`` echo replicas, round-robin."""
    checked = _system(system)
    require_positive_int("n_replicas", n_replicas)
    client = _start(checked, name, spawn, [echo] * n_replicas)
    return OriginalModelReplicaPool(client, checked)


def spawn_fair_share(spawn: Callable[..., FairShareScheduler], system: SystemLike,
                     tenants: Iterable[tuple[int, float]], max_in_flight: int = 4,
                     name: str | None = None) -> OriginalFairShareScheduler:
    """The original's ``FairShareScheduler.spawn``: the echo for ``(id, weight)`` tenants.

    Tenant ids are distinct ints >= 0; weights are numbers > 0.
    """
    checked = _system(system)
    if isinstance(tenants, str | bytes) or not isinstance(tenants, Iterable):
        raise InvalidArgument(f"tenants must be a list of (id, weight), got {tenants!r}")
    weights: dict[int, float] = {}
    for pair in tenants:
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise InvalidArgument(f"a tenant is an (id, weight) pair, got {pair!r}")
        tenant = _token("a tenant id", pair[0])
        if tenant in weights:
            raise InvalidArgument(f"tenant {tenant} is given twice")
        weights[tenant] = pair[1]
    client = _start(checked, name, spawn, echo, weights=weights,
                    max_in_flight=max_in_flight)
    return OriginalFairShareScheduler(client, checked, weights)


def spawn_hot_swap(spawn: Callable[..., ModelHotSwapServer], system: SystemLike,
                   name: str | None = None) -> OriginalHotSwapServer:
    """The original's ``HotSwapServer.spawn``: serves ``VersionTag(0)``."""
    checked = _system(system)
    client = _start(checked, name, spawn, VersionTag(0))
    return OriginalHotSwapServer(client, checked)


def spawn_speculative(spawn: Callable[..., SpeculativeDecoder], system: SystemLike, k: int = 4,
                      max_total_tokens: int = 64,
                      name: str | None = None) -> OriginalSpeculativeDecoder:
    """The original's ``SpeculativeDecoder.spawn``: ``draft_next`` and ``verify_next``.

    ``k`` tokens are drafted per round; a sequence (prompt included) grows to
    at most ``max_total_tokens``.
    """
    checked = _system(system)
    require_positive_int("max_total_tokens", max_total_tokens)
    client = _start(checked, name, spawn, draft_next, verify_next, k=k,
                    max_tokens=max_total_tokens)
    return OriginalSpeculativeDecoder(client, checked, max_total_tokens)


def spawn_moe(spawn: Callable[..., MoeRouter], system: SystemLike, n_experts: int = 2,
              top_k: int = 1, name: str | None = None) -> OriginalMoeRouter:
    """The original's ``MoeRouter.spawn``: ``n_experts`` bias experts under ``LinearGate``."""
    checked = _system(system)
    require_positive_int("n_experts", n_experts)
    client = _start(checked, name, spawn, LinearGate(n_experts),
                    [BiasExpert(float(i)) for i in range(n_experts)], top_k=top_k)
    return OriginalMoeRouter(client, checked)


HotSwapServer = ModelHotSwapServer
"""The original package's name of ``ModelHotSwapServer``."""

attach_spawn(DynamicBatchingServer, spawn_batching, "batch_fn")
attach_spawn(InferenceCascade, spawn_cascade, "stages", is_models)
attach_spawn(ModelReplicaPool, spawn_pool, "replicas", is_models)
attach_spawn(FairShareScheduler, spawn_fair_share, "fn")
attach_spawn(ModelHotSwapServer, spawn_hot_swap, "model")
attach_spawn(SpeculativeDecoder, spawn_speculative, "draft")
attach_spawn(MoeRouter, spawn_moe, "gate")
