"""The tune-replay worker process: reads a WorkerConfig line, then one candidate per line on stdin,
and answers one JSON line per candidate on stdout. Exits when stdin closes, or after a CUDA error
that leaves the context unusable (the parent then starts a new worker)."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from replayfmt.cuda.driver import check
from replayfmt.errors import DeviceError, DeviceUnavailableError, ReplayError
from replayfmt.execute import ReplaySession, open_replay
from replayfmt.format import model as m
from replayfmt.format.layout import DEFAULT_LIMITS
from replayfmt.measure.fanout import Outcome
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.options import ReplayOptions
from replayfmt.replay.plan_options import PlanOptions, ShapeOverride


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    config = json.loads(sys.stdin.readline())
    evaluator = Evaluator(config)
    if evaluator.problem is not None:
        _reply(evaluator.problem)
        return 1
    _reply({"ready": True})
    try:
        for line in sys.stdin:
            reply = evaluator.evaluate(json.loads(line))
            _reply(reply)
            if reply.get("fatal"):
                return 1
    finally:
        evaluator.close()
    return 0


class Evaluator:
    """One prepared replay of a capture (as a WorkerConfig dict describes it) that evaluates
    candidates: each request sets the target launches' shape, replays and verifies once, then
    times the targets. ``problem`` is the reply to give when it could not be prepared."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.problem: dict[str, Any] | None = None
        self.session: ReplaySession | None = None
        self.cap_used = False  # whether a register cap was ever applied (then None must restore the original)
        try:
            self.session = open_replay(
                config["capture"],
                PlanOptions.from_dict(config["plan"]),
                limits=DEFAULT_LIMITS.overridden(config.get("limits", {})),
            )
            self._prepare()
        except ReplayError as exc:  # "unavailable": no driver or GPU here (the tool exits 2, as the others do)
            self.problem = {"error": str(exc), "unavailable": isinstance(exc, DeviceUnavailableError)}
            self.close()

    def _prepare(self) -> None:
        session, config = self.session, self.config
        assert session is not None
        tolerance = Tolerance(enabled=config["tolerance"], rtol=config["rtol"], atol=config["atol"])
        self.replayer = replayer = session.start(
            ReplayOptions(devices=(config["device"],), verify=True, tolerance=tolerance)
        )
        cu = self.cu = replayer.cu
        timed = [session.capture.operation(i) for i in config["operations"]]
        self.targets = [op for op in timed if isinstance(op, m.Launch)]
        graphs = replayer.plan.graphs  # kernel nodes of CUDA graphs, tuned as launches are
        self.nodes = [(graph, index, graphs[graph].nodes[index]) for graph, index in config.get("nodes", ())]
        self.events = []
        for op in timed:
            pair = (check(cu.cuEventCreate(0), "event"), check(cu.cuEventCreate(0), "event"))
            replayer.wrap_with_events(op.index, *pair)
            self.events.append(pair)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def evaluate(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one candidate: its median and spread, verified, or its error (``fatal``:
        the CUDA context is unusable, the process must end)."""
        if self.problem is not None:
            return self.problem
        config, replayer, targets, nodes = self.config, self.replayer, self.targets, self.nodes
        try:
            reshape = ShapeOverride.from_dict(request["reshape"])
            if request["max_registers"] is not None or self.cap_used:
                block = reshape.apply((targets or [n for *_, n in nodes])[0]).block
                threads = block[0] * block[1] * block[2]
                replayer.load_with_register_cap(targets[0].executable, request["max_registers"], threads)
                self.cap_used = True
            for op in targets:
                shape = reshape.apply(op)
                if shape.shared_memory > 48 * 1024:
                    replayer.opt_in_shared_memory(op.executable, op.function, shape.shared_memory)
                replayer.set_launch_shape(op.index, shape.grid, shape.block, shape.shared_memory)
            for graph, index, node in nodes:
                shape = reshape.apply(node)
                if shape.shared_memory > 48 * 1024:
                    replayer.opt_in_shared_memory(node.executable, node.function, shape.shared_memory)
                replayer.set_graph_node_shape(graph, index, shape.grid, shape.block, shape.shared_memory)
            result = replayer.run(1, verify=True)
            if result.mismatches:  # a wrong answer is this candidate's result, not the worker's failure
                return {"verified": False, "error": f"wrong result: {result.mismatches[0].line()}"}
            verified = True if result.reports else None
            times = []
            for repetition in range(config["warmup"] + config["repetitions"]):
                replayer.run(1, verify=False)
                if repetition >= config["warmup"]:
                    times.append(sum(check(self.cu.cuEventElapsedTime(a, b), "elapsed") for a, b in self.events))
            stddev = statistics.stdev(times) if len(times) > 1 else 0.0
            return {"median_ms": statistics.median(times), "stddev_ms": stddev, "verified": verified}
        except DeviceError as exc:
            return {"error": str(exc), "fatal": exc.sticky}
        except ReplayError as exc:
            return {"error": str(exc)}


# A fan-out worker process keeps the replay it prepared for a capture across the candidates it
# is given (preparing is the cold work); the process exists to hold it, and a sticky error ends
# its use (the fan-out replaces the process).
_PREPARED: dict[str, Evaluator] = {}


def evaluate_candidate(config: dict[str, Any], request: dict[str, Any]) -> Outcome:
    """A fan-out task: evaluate one candidate on this worker process's prepared replay of
    ``config`` (prepared by its first task). Poisoned after a sticky CUDA error."""
    key = json.dumps(config, sort_keys=True)
    evaluator = _PREPARED.get(key)
    if evaluator is None:
        for old in _PREPARED.values():
            old.close()
        _PREPARED.clear()
        evaluator = _PREPARED[key] = Evaluator(config)
    reply = evaluator.evaluate(request)
    return Outcome(reply, poisoned=bool(reply.get("fatal")))


if __name__ == "__main__":
    sys.exit(main())
