"""Measuring replayed work: timing a scope (``benchmark``) and searching launch shapes (``tune``,
with its fault-isolated worker process ``tune_worker``)."""
