"""Device memory at an address of a given shape, for capture scripts that need one (a tensor next
to a 4 GiB boundary, a word that lands in memory no kernel uses): allocations are made until one
holds such an address. The driver hands them out side by side, so a run of them drifts through a
4 GiB window; their size is no divisor of 4 GiB, so their starts drift across its boundaries.

A script that cannot get one here (other programs hold the device's memory) prints a line that
starts with CANNOT and exits 3; the tests skip on that line."""

from collections.abc import Callable

SIZE = 66 << 20
GIB4 = 1 << 32
CANNOT = "cannot be set up here:"


def allocation_where(address_in: Callable[[int], int | None], what: str) -> int:
    """The address ``address_in`` finds in an allocation of SIZE bytes (given its start; None:
    not in this one), the first of enough allocations to cross a 4 GiB window twice; the
    allocations before it are freed, that one is kept."""
    from cuda.bindings import driver as cu  # here: the tests read CANNOT on machines without CUDA

    made: list[int] = []
    found = None
    for _ in range(2 * GIB4 // SIZE + 64):
        err, address = cu.cuMemAlloc(SIZE)
        if err != cu.CUresult.CUDA_SUCCESS:  # other programs hold the device's memory
            break
        found = address_in(int(address))
        if found is not None:
            break
        made.append(int(address))
    for base in made:
        (err,) = cu.cuMemFree(base)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"cuMemFree failed: {err}")
    if found is None:
        print(f"{CANNOT} no allocation {what} could be made")
        raise SystemExit(3)
    return found
