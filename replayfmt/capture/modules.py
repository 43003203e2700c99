"""Module images the program loaded, as the recorder keeps them: each image is stored once (its
bytes as a payload, or a file reference by the file policy) the first time a kernel of it runs,
and every launched kernel of it becomes an executable sharing that payload."""

from __future__ import annotations

from dataclasses import dataclass, field

from replayfmt.capture import events as ev
from replayfmt.capture.file_references import FileReferences
from replayfmt.container.writer import CaptureWriter
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError, detect_format, parse_cubin


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


def store_module(module: Module, writer: CaptureWriter, files: FileReferences, policy: m.FilePolicy) -> None:
    """Write the module's image into the capture (once): a file reference under the reference
    and fail policies, otherwise a payload; its format and architecture read from the bytes."""
    if module.stored:
        return
    image = module.image
    data = image.data
    if data is None and image.path is not None:
        if policy in (m.FilePolicy.REFERENCE, m.FilePolicy.FAIL):
            module.file = files.reference(image.path, policy)
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
    if not module.file:
        module.payload = writer.add_payload(data)
    module.image = ev.ModuleImage(image.key, None, image.path, image.call)  # the bytes are stored now
