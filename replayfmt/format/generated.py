"""The generated FlatBuffers builders (replayfmt/format/fb, made from replayfmt/schema.fbs by
scripts/generate_schema.py), each imported when first used: only writing needs them, and a
replay, which only reads (through replayfmt.format.decoder), would spend 50 ms importing them."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


class GeneratedModules:
    """``fb.Buffer`` is the module replayfmt.format.fb.Buffer, imported when first asked for (and
    kept: later lookups are an attribute's)."""

    def __getattr__(self, name: str) -> ModuleType:
        if name.startswith("_"):
            raise AttributeError(name)
        module = importlib.import_module(f"replayfmt.format.fb.{name}")
        setattr(self, name, module)
        return module

    def import_all(self) -> None:
        """Import every builder now: a writer does at its opening, so that its first records,
        which may be made inside a program's step while the recorder holds it, import none."""
        import replayfmt.format.fb as package

        for module in pkgutil.iter_modules(package.__path__):
            getattr(self, module.name)


fb = GeneratedModules()
