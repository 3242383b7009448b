"""``atomr_accel.patterns``: every public name is exported and documented; clients wrap refs."""

from __future__ import annotations

import inspect

import pytest

from atomr_accel import InvalidArgument, patterns
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import DynamicBatchingServer, PatternError, RequestRejected


def test_every_export_exists_and_is_documented() -> None:
    assert patterns.__doc__
    assert len(patterns.__all__) == len(set(patterns.__all__))
    for name in patterns.__all__:
        obj = getattr(patterns, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"patterns.{name} has no docstring"
        if inspect.isclass(obj):
            for member_name, member in inspect.getmembers(obj):
                if member_name.startswith("_"):
                    continue
                if inspect.isfunction(member) or isinstance(member, property):
                    assert inspect.getdoc(member), f"patterns.{name}.{member_name}"


def test_errors_share_one_base() -> None:
    for name in ("BatchResultMismatch", "InvalidModelOutput", "NoReplicaAvailable",
                 "QueueOverflow", "RequestDropped", "RequestRejected", "UnknownTenant"):
        assert issubclass(getattr(patterns, name), PatternError)


@pytest.mark.anyio
async def test_a_blueprint_spawned_from_props_is_driven_through_its_client() -> None:
    async def double(items: list[int]) -> list[int]:
        return [2 * i for i in items]

    async with ActorSystem("t") as system:
        props = DynamicBatchingServer.props(double, max_batch=2, max_wait=0.01)
        server = DynamicBatchingServer(system.spawn(props, "batcher"))
        assert server.path == "/user/batcher" and "batcher" in repr(server)
        assert await server.submit(21) == 42
        with pytest.raises(InvalidArgument):
            DynamicBatchingServer.spawn(object(), double, max_batch=1,  # type: ignore[arg-type]
                                        max_wait=0.0)
        assert issubclass(RequestRejected, PatternError)
