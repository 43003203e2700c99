"""The generated FlatBuffers builders (replayfmt/format/fb, made from replayfmt/schema.fbs by
scripts/generate_schema.py), each imported when first used: only writing needs them, and a
replay, which only reads (through replayfmt.format.decoder), would spend 50 ms importing them."""

from __future__ import annotations

import importlib
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


fb = GeneratedModules()
