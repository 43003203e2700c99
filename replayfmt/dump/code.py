"""Which GPUs a capture's code loads on (:mod:`replayfmt.format.targets`), for dump-replay: per
executable (cached per image: a recorder writes one executable per kernel of a module, all sharing
its image), and for the capture as a whole: the compute capabilities every executable loads on, by
a cubin of its own or through the driver's JIT of its PTX, and the executables that hold no PTX."""

from __future__ import annotations

from dataclasses import dataclass, field

from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.format.targets import CodeTargets, code_targets, code_targets_at
from replayfmt.reader import Capture

# compute capabilities a capture's reach is stated over (those GPUs have been made of)
KNOWN_CAPABILITIES = (
    (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)
)  # fmt: skip
_READ_WHOLE = 1 << 20  # an image up to this size is read whole; a larger one, header by header


class CodeTargetCache:
    """The targets of each executable's image, read once per image."""

    def __init__(self, cap: Capture) -> None:
        self.cap = cap
        self._by_image: dict[tuple[int, int], CodeTargets] = {}

    def of(self, exe: m.Executable) -> CodeTargets:
        key = (exe.payload, exe.file)
        found = self._by_image.get(key)
        if found is None:
            found = self._by_image[key] = self._read(exe)
        return found

    def _read(self, exe: m.Executable) -> CodeTargets:
        if not exe.payload:
            return CodeTargets(unreadable=f"loaded from file reference {exe.file}" if exe.file else "no image")
        try:
            size = self.cap.payload(exe.payload).size
            if size <= _READ_WHOLE:
                return code_targets(bytes(self.cap.read_payload(exe.payload)), exe.format)
            return code_targets_at(lambda at, n: self._piece(exe.payload, at, n), size, exe.format)
        except (ReplayError, KeyError) as exc:
            return CodeTargets(unreadable=f"payload {exe.payload} unreadable ({exc})")

    def _piece(self, payload: int, at: int, size: int) -> bytes:
        out = bytearray(size)
        self.cap.read_payload_into(payload, out, at)
        return bytes(out)


@dataclass
class CaptureTargets:
    """Where a whole capture's code loads: ``by_cubin`` (every executable has a cubin for it),
    ``by_ptx`` (every executable loads, some only by JIT-compiling PTX), ``without_ptx`` and
    ``unreadable`` (executable ids)."""

    by_cubin: list[str] = field(default_factory=list)
    by_ptx: list[str] = field(default_factory=list)
    without_ptx: list[int] = field(default_factory=list)
    unreadable: list[int] = field(default_factory=list)
    executables: int = 0
    why_unknown: str = ""  # the first unreadable executable's reason

    def line(self) -> str:
        if not self.executables:
            return "no executables"
        if self.unreadable:
            return (
                f"unknown: the code of {len(self.unreadable)} executable(s) could not be read "
                f"({_ids(self.unreadable)}; {self.why_unknown})"
            )
        cubin = " ".join(self.by_cubin) or "none"
        ptx = " ".join(self.by_ptx) or "none"
        text = f"{cubin} (cubins); {ptx} (PTX JIT)"
        if self.without_ptx:
            text += f"; no PTX in {len(self.without_ptx)} of {self.executables} executable(s): {_ids(self.without_ptx)}"
        else:
            text += "; every executable holds PTX"
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "runs_on_by_cubin": self.by_cubin,
            "runs_on_by_ptx": self.by_ptx,
            "executables_without_ptx": self.without_ptx,
            "executables_unknown_targets": self.unreadable,
        }


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:12]))
    return shown + (f" and {len(ids) - 12} more" if len(ids) > 12 else "")


def capture_targets(cache: CodeTargetCache, executables: list[m.Executable]) -> CaptureTargets:
    """Where every one of ``executables`` loads (see :class:`CaptureTargets`)."""
    out = CaptureTargets(executables=len(executables))
    known = []
    for exe in executables:
        t = cache.of(exe)
        if t.unreadable:
            out.unreadable.append(exe.id)
            out.why_unknown = out.why_unknown or t.unreadable
            continue
        known.append(t)
        if not t.ptx:
            out.without_ptx.append(exe.id)
    if out.unreadable or not known:
        return out
    for cc in KNOWN_CAPABILITIES:
        name = f"sm_{cc[0]}{cc[1]}"
        if all(any(c.loads_on(cc) for c in t.cubins) for t in known):
            out.by_cubin.append(name)
        elif all(t.loads_on(cc) for t in known):
            out.by_ptx.append(name)
    return out
