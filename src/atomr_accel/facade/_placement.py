"""The facade ``Placement``: pick one of several devices by policy."""

from __future__ import annotations

from collections.abc import Sequence

from atomr_accel.actor import ActorError, ActorRef
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, gpu_error_of
from atomr_accel.device import AddDevice, Place, Placed, Policy
from atomr_accel.facade._device import Device
from atomr_accel.facade._portal import Portal, blocking

__all__ = ["Placement", "policy_of"]


def policy_of(policy: Policy | str) -> Policy:
    """The ``Policy`` named by ``policy`` (``InvalidArgument`` for an unknown name)."""
    try:
        return Policy(policy)
    except ValueError:
        names = ", ".join(p.value for p in Policy)
        raise InvalidArgument(f"unknown placement policy {policy!r}; choose from {names}") \
            from None


class Placement:
    """Picks a device for the next piece of work: ``dev = placement.pick(bytes_needed=...)``.

    Made by ``system.placement(...)``; a ``PlacementActor`` decides on the
    devices' real stats (see ``Policy``). ``pick`` raises ``OutOfMemory`` when
    no device has ``bytes_needed`` free and ``DeviceUnavailable`` when every
    device has stopped.
    """

    def __init__(self, ref: ActorRef, devices: Sequence[Device], policy: Policy,
                 portal: Portal, system: str) -> None:
        self.ref = ref
        self.policy = policy
        self._devices = {device.ref: device for device in devices}
        self._portal = portal
        self._system = system

    @property
    def devices(self) -> list[Device]:
        """The devices it picks from, in turn order."""
        return list(self._devices.values())

    def add(self, device: Device) -> None:
        """Pick from ``device`` too, after the others in turn (from any thread)."""
        if device.ref not in self._devices:
            self._devices[device.ref] = device
            self.ref.tell(AddDevice(device.ref))

    async def pick_async(self, bytes_needed: int = 0, policy: Policy | str | None = None
                         ) -> Device:
        """Return the device ``policy`` (default: this placement's) picks now.

        ``bytes_needed`` rules out devices with less free device memory.
        """
        message = Place(bytes_needed, None if policy is None else policy_of(policy))
        try:
            placed: Placed = await self._portal.acall(self.ref.ask(message))
        except GpuRuntimeError:
            raise
        except ActorError as exc:
            raise gpu_error_of(exc, self._system, "pick") from exc
        return self._devices[placed.device]

    pick = blocking(pick_async)

    def __repr__(self) -> str:
        return f"Placement({self.policy.value}, devices={len(self._devices)})"
