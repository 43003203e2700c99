"""Which host addresses are backed by files: /proc/self/maps, for weights loaded with mmap
(safetensors, ``torch.load(mmap=True)``) whose host-to-device copies can reference the file
instead of storing its bytes again."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    offset: int  # file offset of ``start``
    inode: int
    path: str

    @property
    def file_backed(self) -> bool:
        """A mapping of a file that a capture may reference: never a device's (the driver maps its
        pinned memory from /dev/nvidiactl) nor a kernel pseudo-file's, which replay refuses to read."""
        if self.inode == 0 or not self.path.startswith("/"):
            return False
        return self.path.startswith("/dev/shm/") or not self.path.startswith(("/dev/", "/proc/", "/sys/"))


def parse_maps(text: str) -> list[Mapping]:
    """The mappings of a /proc/PID/maps text, sorted by start address."""
    mappings = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        try:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            offset, inode = int(fields[2], 16), int(fields[4])
        except ValueError:
            continue
        path = fields[5].strip() if len(fields) > 5 else ""
        if path.endswith(" (deleted)"):
            inode = 0  # the file is gone: its bytes must be captured
        mappings.append(Mapping(start, end, offset, inode, path))
    mappings.sort(key=lambda mp: mp.start)
    return mappings


class HostFiles:
    """Looks up host ranges in the process's mappings; re-reads the maps only on a miss."""

    def __init__(self, maps_path: str | Path = "/proc/self/maps") -> None:
        self._path = Path(maps_path)
        self._mappings: list[Mapping] = []
        self._starts: list[int] = []

    def _reload(self) -> None:
        try:
            self._mappings = parse_maps(self._path.read_text())
        except OSError:
            self._mappings = []
        self._starts = [mp.start for mp in self._mappings]

    def _find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._mappings[i].end:
            return self._mappings[i]
        return None

    def file_range(self, address: int, size: int) -> tuple[str, int] | None:
        """(path, file offset) when ``size`` bytes at ``address`` all come from one file mapping."""
        mapping = self._find(address)
        if mapping is None:
            self._reload()
            mapping = self._find(address)
        if mapping is None or not mapping.file_backed or address + size > mapping.end:
            return None
        return mapping.path, mapping.offset + (address - mapping.start)
