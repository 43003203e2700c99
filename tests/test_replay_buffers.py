"""Where replay places a buffer: near a 4 GiB boundary, at its recorded address modulo 4 GiB."""

import pytest

from replayfmt.replay.buffers import near_boundary

GIB4 = 1 << 32
BOUNDARY = 0x7F26 * GIB4


@pytest.mark.parametrize(
    ("address", "size", "near"),
    [
        (BOUNDARY, 20 << 20, True),  # starts on one: (small int, 0x7f26) lands inside
        (BOUNDARY - (2 << 20), 2 << 20, True),  # ends on one: (small negative int, 0x7f25) lands inside
        (BOUNDARY - (2 << 20), 4 << 20, True),  # spans one
        (BOUNDARY + (1 << 16), 2 << 20, False),  # starts past the last small int
        (BOUNDARY - (1 << 17), 1 << 16, False),  # ends before the first small negative int
        (BOUNDARY - (1 << 17), (1 << 16) + 1, True),
        (BOUNDARY + (1 << 31) - 16, 32, True),  # holds INT32_MIN beside a stale half
        (BOUNDARY + (1 << 31) + 1, 1 << 20, False),
        (BOUNDARY + (1 << 20), 8 * GIB4, True),  # an arena across several
        (0, 1 << 20, False),  # no recorded address
    ],
)
def test_buffers_near_a_4_gib_boundary_are_found(address, size, near):
    assert near_boundary(address, size) is near
