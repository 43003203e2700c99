"""Replaying a capture: a plan of every check that needs no GPU (``plan``), the ``Replayer`` that
rebuilds and runs it on devices (``execute``), and checkpoint verification (``compare``)."""
