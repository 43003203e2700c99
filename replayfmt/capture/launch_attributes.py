"""A launch's attributes (cuLaunchKernelEx's CUlaunchAttribute array) as the recorder keeps them:
cluster dimensions, cooperative, programmatic stream serialization (PDL), and the events the
kernel's blocks trigger. Read by the Python path (cupti_source) by the same rule as the C launch
ring (launch_ring.c), so that both paths flag a launch alike."""

from __future__ import annotations

import struct
from typing import NamedTuple

from replayfmt.capture.process_memory import MEMORY, u64

# CUlaunchAttributeID: cooperative, cluster dimension, programmatic stream serialization (PDL); the
# programmatic and launch completion events (the kernel's blocks trigger them: recorded after it)
_ATTRIBUTE_COOPERATIVE, _ATTRIBUTE_CLUSTER, _ATTRIBUTE_PROGRAMMATIC = 2, 4, 6
_ATTRIBUTE_EVENTS = (7, 12)  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, _LAUNCH_COMPLETION_EVENT: value.event
_ATTRIBUTE_SIZE = 72  # sizeof(CUlaunchAttribute)
_MAX_ATTRIBUTES = 64  # as many as the C launch ring reads


class LaunchAttributes(NamedTuple):
    """What a launch's attributes ask of it, as the format keeps it."""

    cluster: tuple[int, int, int] = (0, 0, 0)
    cooperative: bool = False
    programmatic: bool = False  # programmatic stream serialization (PDL)


PLAIN = LaunchAttributes()


def launch_attributes(address: int, count: int) -> tuple[LaunchAttributes, list[int]]:
    """A CUlaunchConfig's attribute array (``count`` at ``address``, none when null): what it asks
    of the launch, and the events it records. The rule is the C launch ring's (launch_ring.c): a
    repeated cluster attribute, the last one; a repeated flag, set when any asks for it."""
    cluster, cooperative, programmatic, events = (0, 0, 0), False, False, []
    end = address + min(count, _MAX_ATTRIBUTES) * _ATTRIBUTE_SIZE if address else 0
    for at in range(address, end, _ATTRIBUTE_SIZE):
        kind, value = struct.unpack_from("<I", MEMORY, at)[0], at + 8
        if kind == _ATTRIBUTE_CLUSTER:
            cluster = struct.unpack_from("<III", MEMORY, value)
        elif kind in (_ATTRIBUTE_COOPERATIVE, _ATTRIBUTE_PROGRAMMATIC) and struct.unpack_from("<i", MEMORY, value)[0]:
            cooperative |= kind == _ATTRIBUTE_COOPERATIVE
            programmatic |= kind == _ATTRIBUTE_PROGRAMMATIC
        elif kind in _ATTRIBUTE_EVENTS and (event := u64(value)):
            events.append(event)
    return LaunchAttributes(cluster, cooperative, programmatic), events
