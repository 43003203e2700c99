"""Module images the program loaded, as the recorder keeps them: each image is stored once, its
bytes as a payload, the first time a kernel of it runs, and every launched kernel of it becomes
an executable sharing that payload.

Images are always stored, whatever the file policy: a module loaded from a file (Triton's and
Inductor's cubins in their compile caches) is small, and a capture that references it stops
replaying as soon as the cache moves. File references are for large data files (mapped weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replayfmt.capture import events as ev
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError, detect_format, parse_cubin
from replayfmt.writer import CaptureWriter


@dataclass
class Module:
    """A loaded module image and what the capture holds of it."""

    image: ev.ModuleImage
    payload: int = 0
    file: int = 0
    format: m.ExecutableFormat = m.ExecutableFormat.UNKNOWN
    arch: str = ""
    executables: dict[str, int] = field(default_factory=dict)  # function name -> executable id

    @property
    def stored(self) -> bool:
        return bool(self.payload or self.file)


def store_module(module: Module, writer: CaptureWriter) -> None:
    """Write the module's image into the capture as a payload (once, whatever the file policy);
    its format and architecture read from the bytes."""
    if module.stored:
        return
    image = module.image
    data = image.data
    if data is None and image.path is not None:
        with open(image.path, "rb") as f:
            data = f.read()
    if data is None:
        raise ValueError(f"module {image.key} has no image")
    try:
        module.format = m.EXECUTABLE_FORMATS[detect_format(data)]
    except CubinError:
        module.format = m.ExecutableFormat.UNKNOWN
    if module.format == m.ExecutableFormat.CUBIN:
        try:
            module.arch = f"sm_{parse_cubin(data).arch}"
        except CubinError:
            pass
    module.payload = writer.add_payload(data)
    module.image = ev.ModuleImage(image.key, None, image.path, image.call)  # the bytes are stored now
