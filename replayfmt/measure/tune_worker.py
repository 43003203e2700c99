"""The tune-replay worker process: reads a WorkerConfig line, then one candidate per line on stdin,
and answers one JSON line per candidate on stdout. Exits when stdin closes, or after a CUDA error
that leaves the context unusable (the parent then starts a new worker)."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from replayfmt.container.files import FileRemap
from replayfmt.cuda.driver import check
from replayfmt.errors import DeviceError, DeviceUnavailableError, ReplayError
from replayfmt.execute import ReplaySession, open_replay
from replayfmt.format import model as m
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.options import ReplayOptions
from replayfmt.replay.plan_options import PlanOptions, Substitution


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    config = json.loads(sys.stdin.readline())
    try:
        session = open_replay(
            config["capture"],
            PlanOptions(
                substitutions=tuple(Substitution.parse(s) for s in config["plan"].get("substitutions", ())),
                remaps=tuple(FileRemap.parse(r) for r in config["plan"].get("remaps", ())),
                fixed_addresses=bool(config["plan"].get("fixed_addresses")),
            ),
        )
    except ReplayError as exc:
        _reply({"error": str(exc)})
        return 1
    with session:
        return _serve(session, config)


def _serve(session: ReplaySession, config: dict[str, Any]) -> int:
    try:
        tolerance = Tolerance(enabled=config["tolerance"], rtol=config["rtol"], atol=config["atol"])
        replayer = session.start(ReplayOptions(devices=(config["device"],), verify=True, tolerance=tolerance))
        cu = replayer.cu
        timed = [session.capture.operation(i) for i in config["operations"]]
        targets = [op for op in timed if isinstance(op, m.Launch)]
        graphs = replayer.plan.graphs  # kernel nodes of CUDA graphs, tuned as launches are
        nodes = [(graph, index, graphs[graph].nodes[index]) for graph, index in config.get("nodes", ())]
        events = []
        for op in timed:
            pair = (check(cu.cuEventCreate(0), "event"), check(cu.cuEventCreate(0), "event"))
            replayer.wrap_with_events(op.index, *pair)
            events.append(pair)
    except ReplayError as exc:  # "unavailable": no driver or GPU here (the tool exits 2, as the others do)
        _reply({"error": str(exc), "unavailable": isinstance(exc, DeviceUnavailableError)})
        return 1
    _reply({"ready": True})
    cap_used = False  # whether a register cap was ever applied (then None must restore the original)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["max_registers"] is not None or cap_used:
                block = tuple(request["block"]) if request["block"] else (targets or [n for *_, n in nodes])[0].block
                threads = block[0] * block[1] * block[2]
                replayer.load_with_register_cap(targets[0].executable, request["max_registers"], threads)
                cap_used = True
            for op in targets:
                grid = tuple(request["grid"]) if request["grid"] else op.grid
                block = tuple(request["block"]) if request["block"] else op.block
                smem = op.shared_memory if request["smem"] is None else request["smem"]
                if smem > 48 * 1024:
                    replayer.opt_in_shared_memory(op.executable, op.function, smem)
                replayer.set_launch_shape(op.index, grid, block, smem)  # type: ignore[arg-type]
            for graph, index, node in nodes:
                grid = tuple(request["grid"]) if request["grid"] else node.grid
                block = tuple(request["block"]) if request["block"] else node.block
                smem = node.shared_memory if request["smem"] is None else request["smem"]
                if smem > 48 * 1024:
                    replayer.opt_in_shared_memory(node.executable, node.function, smem)
                replayer.set_graph_node_shape(graph, index, grid, block, smem)  # type: ignore[arg-type]
            result = replayer.run(1, verify=True)
            if result.mismatches:  # a wrong answer is this candidate's result, not the worker's failure
                _reply({"verified": False, "error": f"wrong result: {result.mismatches[0].line()}"})
                continue
            verified = True if result.reports else None
            times = []
            for repetition in range(config["warmup"] + config["repetitions"]):
                replayer.run(1, verify=False)
                if repetition >= config["warmup"]:
                    times.append(sum(check(cu.cuEventElapsedTime(a, b), "elapsed") for a, b in events))
            stddev = statistics.stdev(times) if len(times) > 1 else 0.0
            _reply({"median_ms": statistics.median(times), "stddev_ms": stddev, "verified": verified})
        except DeviceError as exc:
            _reply({"error": str(exc), "fatal": exc.sticky})
            if exc.sticky:
                return 1
        except ReplayError as exc:
            _reply({"error": str(exc)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
