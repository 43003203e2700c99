"""Editing captures: cutting operations out of one into a standalone capture (``extract``) and
comparing two (``diff``). One module per job: ``select`` (which operations), ``closure`` (which
objects and bytes they need), ``shadow`` (what the capture itself knows of buffer contents),
``prefix`` (the bytes it does not know, from a GPU replay), ``transplant`` (objects and operations
into a new file), ``extract`` (the whole cut), ``diff`` and ``diff_view`` (two captures compared)."""

from __future__ import annotations

from replayfmt.edit.extract import ExtractOptions, ExtractResult, StateSource, extract
from replayfmt.edit.select import Selection

__all__ = ["ExtractOptions", "ExtractResult", "Selection", "StateSource", "extract"]
