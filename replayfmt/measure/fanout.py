"""Fan-out: tasks (tune candidates, corpus captures) run in worker processes, one per GPU, on Dask
distributed when it is installed (``pip install 'replayfmt[cluster]'``) and on local processes
otherwise.

Engines, chosen by :func:`open_fanout`:

* ``dask`` on a cluster of this machine: dask-cuda's ``LocalCUDACluster`` when it is importable
  (one worker per GPU, each pinned with ``CUDA_VISIBLE_DEVICES``), else a distributed
  ``SpecCluster`` of one single-threaded worker process per GPU under a nanny, each pinned the
  same way; or an existing cluster (``scheduler``: its address), whose workers are taken as they
  are (a ``dask-cuda-worker`` pins one GPU each);
* ``local``: one spawned process per GPU, pinned the same way, spoken to through a pipe (or one
  process pinned to a set of GPUs, for work that needs several at once: :class:`LocalFanOut`).

Fault isolation is the point: every worker runs one task at a time (the client keeps one in
flight per worker), so a task that breaks its CUDA context (it returns an :class:`Outcome` with
``poisoned``), crashes its process or overruns the timeout loses only its worker, which is
replaced (Dask: the nanny starts it again; local: a new process), and the sweep goes on; the
task's result says so (``worker_replaced``) and :attr:`FanOut.replaced` counts it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from replayfmt.errors import ReplayError, ReplayUsageError

ENGINES = ("auto", "dask", "local")


class Outcome(NamedTuple):
    """What a task returns when its worker must not run another one (a sticky CUDA error left
    the process's context unusable): ``value`` is still its result."""

    value: Any
    poisoned: bool = False


@dataclass(frozen=True)
class Task:
    """One unit of work: ``fn(*args)`` in a worker process (both must pickle)."""

    key: Any
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass
class TaskResult:
    """A task's value, or why it has none; ``worker`` names where it ran."""

    key: Any
    value: Any = None
    error: str = ""  # the worker died, timed out, or the task raised
    worker: str = ""
    worker_replaced: bool = False  # its worker was replaced after it (died, timed out, poisoned)


def dask_available() -> bool:
    """Whether dask.distributed can be imported here."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def open_fanout(
    gpus: Iterable[int] = (0,),
    *,
    engine: str = "auto",
    scheduler: str | None = None,
    pin: bool = True,
) -> FanOut:
    """A fan-out over one worker per GPU in ``gpus`` (or over the workers of the cluster at
    ``scheduler``). ``engine``: ``auto`` (Dask when installed, else local processes), ``dask`` or
    ``local``. ``pin``: pin each worker to its GPU with ``CUDA_VISIBLE_DEVICES`` (off for
    work that needs no GPU)."""
    gpus = list(dict.fromkeys(gpus))
    if engine not in ENGINES:
        raise ReplayUsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if not gpus and scheduler is None:
        raise ReplayUsageError("give at least one device to fan out over")
    use_dask = engine == "dask" or scheduler is not None or (engine == "auto" and dask_available())
    if use_dask:
        if not dask_available():
            why = "--scheduler needs" if scheduler is not None else "--engine dask needs"
            raise ReplayUsageError(f"{why} dask distributed: pip install 'replayfmt[cluster]'")
        return DaskFanOut(gpus, scheduler=scheduler, pin=pin)
    return LocalFanOut(gpus, pin=pin)


class FanOut:
    """Runs tasks on its workers, one at a time each; subclasses say how a worker is reached."""

    engine = ""
    replaced = 0  # workers replaced so far

    @property
    def workers(self) -> list[str]:
        raise NotImplementedError

    def describe(self) -> str:
        """One line: the engine and its workers."""
        return f"{self.engine}: {len(self.workers)} worker(s) ({', '.join(self.workers)})"

    def run(self, tasks: Iterable[Task], *, timeout: float | None = None) -> Iterator[TaskResult]:
        """Run every task, one at a time per worker; yield results as they complete."""
        pending = iter(tasks)
        idle = list(self.workers)
        running: dict[Any, tuple[str, Task, float]] = {}  # handle -> (worker, task, started)
        exhausted = False
        while True:
            while idle and not exhausted:
                task = next(pending, None)
                if task is None:
                    exhausted = True
                    break
                worker = idle.pop(0)
                running[self._submit(worker, task)] = (worker, task, time.monotonic())
            if not running:
                if not exhausted:
                    raise ReplayError(f"every worker was lost ({self.describe()}); the sweep cannot go on")
                return
            wait = None
            if timeout is not None:
                wait = max(0.0, min(started + timeout for _, _, started in running.values()) - time.monotonic())
            for handle in self._wait(list(running), wait):
                worker, task, _ = running.pop(handle)
                result, lost = self._collect(handle, worker, task)
                idle += self._after(worker, result, lost)
                yield result
            if timeout is not None:
                now = time.monotonic()
                for handle, (worker, task, started) in list(running.items()):
                    if now - started >= timeout:
                        del running[handle]
                        self._cancel(handle)
                        result = TaskResult(task.key, error=f"timed out after {timeout:g} s", worker=worker)
                        result.worker_replaced = True
                        idle += self._replace(worker)
                        yield result

    def _after(self, worker: str, result: TaskResult, lost: bool) -> list[str]:
        """The worker that takes the next task after ``result``: a fresh one when the task
        poisoned it or its process was ``lost`` (an engine whose workers come back by
        themselves has already replaced it: then ``lost`` is False and the result says so)."""
        if isinstance(result.value, Outcome):
            lost |= result.value.poisoned
            result.value = result.value.value
        if lost:
            result.worker_replaced = True
            return self._replace(worker)
        return [worker] if worker in self.workers else []

    # -- what an engine provides ---------------------------------------------------------------

    def _submit(self, worker: str, task: Task) -> Any:
        raise NotImplementedError

    def _wait(self, handles: list[Any], timeout: float | None) -> list[Any]:
        raise NotImplementedError

    def _collect(self, handle: Any, worker: str, task: Task) -> tuple[TaskResult, bool]:
        """The task's result, and whether its worker process was lost and must be replaced."""
        raise NotImplementedError

    def _cancel(self, handle: Any) -> None:
        raise NotImplementedError

    def _replace(self, worker: str) -> list[str]:
        """Replace a worker's process: ``[worker]`` when it is back, ``[]`` when it is lost."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> FanOut:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------
# Dask distributed


class DaskFanOut(FanOut):
    """Workers of a Dask cluster: started here (one per GPU) or reached at ``scheduler``."""

    engine = "dask"

    def __init__(self, gpus: list[int], *, scheduler: str | None, pin: bool) -> None:
        import dask
        from distributed import Client

        # A task that kills its worker is this sweep's result, never retried on another worker.
        self._config = dask.config.set({"distributed.scheduler.allowed-failures": 0})
        self._config.__enter__()
        self.cluster: Any = None
        try:
            if scheduler is not None:
                try:
                    self.client = Client(scheduler, timeout=30)
                except (OSError, TimeoutError, ValueError, TypeError) as exc:
                    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise ReplayUsageError(f"--scheduler {scheduler}: no Dask scheduler reached ({why})") from None
                self.engine = f"dask at {scheduler}"
            else:
                self.cluster = _local_cluster(gpus, pin)
                self.engine = f"dask ({type(self.cluster).__name__})"
                self.client = Client(self.cluster)
            self.client.wait_for_workers(max(1, len(gpus) if scheduler is None else 1), timeout=120)
            self._addresses: dict[str, str] = {}
            self._ran_on: dict[str, str] = {}  # worker -> the address of its process that took its last task
            self._lost: set[str] = set()
            self._names = self._worker_names()
        except BaseException:
            self.close()
            raise

    def _worker_names(self) -> list[str]:
        """The workers' names now (and their addresses, in ``_addresses``)."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        self._addresses = {str(w.get("name", address)): address for address, w in info.items()}
        return sorted(self._addresses)

    @property
    def workers(self) -> list[str]:
        return [name for name in self._names if name not in self._lost]

    def _submit(self, worker: str, task: Task) -> Any:
        # restricted by address (a name may be a number, which the scheduler knows as such)
        address = self._ran_on[worker] = self._addresses.get(worker, worker)
        return self.client.submit(task.fn, *task.args, workers=[address], allow_other_workers=False, pure=False)

    def _wait(self, handles: list[Any], timeout: float | None) -> list[Any]:
        from distributed import wait

        with contextlib.suppress(TimeoutError):
            wait(handles, timeout=timeout, return_when="FIRST_COMPLETED")
        return [h for h in handles if h.done()]

    def _collect(self, handle: Any, worker: str, task: Task) -> tuple[TaskResult, bool]:
        from distributed import KilledWorker

        try:
            return TaskResult(task.key, handle.result(), worker=worker), False
        except KilledWorker:  # its nanny starts the process again: wait for it
            result = TaskResult(task.key, error="the worker died (its process ended during the task)", worker=worker)
            result.worker_replaced = True
            self.replaced += 1
            if not self._wait_for(worker):
                self._lost.add(worker)
            return result, False
        except Exception as exc:  # the task raised: its own error, the worker lives on
            return TaskResult(task.key, error=f"{type(exc).__name__}: {exc}", worker=worker), False

    def _cancel(self, handle: Any) -> None:
        handle.cancel()

    def _replace(self, worker: str) -> list[str]:
        """End the worker's process (from its own event loop, which answers even while a task
        hangs its thread) so that its nanny starts a fresh one, as after a crash; Dask's
        restart_workers races with a SpecCluster's own bookkeeping and can lose the worker."""
        self.replaced += 1
        self._worker_names()
        address = self._ran_on[worker] = self._addresses.get(worker, "")
        if address:
            with contextlib.suppress(Exception):
                self.client.run(_end_process, workers=[address], wait=False)
        if self._wait_for(worker):
            return [worker]
        self._lost.add(worker)
        return []

    def _wait_for(self, worker: str, timeout: float = 120.0) -> bool:
        """Until a fresh process of the worker named ``worker`` is registered (its nanny starts
        it again after the old one ended); False when none came within ``timeout``."""
        old = self._ran_on.get(worker, "")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._worker_names()
            address = self._addresses.get(worker)
            if address is not None and address != old:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), self.cluster
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
        if self._config is not None:
            self._config.__exit__(None, None, None)
            self._config = None


async def _end_process() -> None:
    """Run on a worker's event loop by the client: end its process at once (its nanny starts a
    new one). A coroutine, so that the client need not wait for an answer that never comes."""
    os._exit(1)


def _local_cluster(gpus: list[int], pin: bool) -> Any:
    """dask-cuda's LocalCUDACluster when importable (and pinning GPUs), else a SpecCluster of one
    single-threaded worker process per GPU under a nanny, pinned with CUDA_VISIBLE_DEVICES."""
    if pin:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            pass
        else:
            return LocalCUDACluster(
                CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)),
                threads_per_worker=1,
                dashboard_address=None,
                silence_logs=50,
            )
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {
        f"gpu{gpu}": {
            "cls": Nanny,
            "options": {
                "nthreads": 1,
                "env": {"CUDA_VISIBLE_DEVICES": str(gpu)} if pin else {},
                "silence_logs": 50,
                "memory_limit": 0,
            },
        }
        for gpu in gpus
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=50)


# ------------------------------------------------------------------------------------------
# Local processes (no Dask)


def worker_name(gpus: tuple[int, ...]) -> str:
    """A local worker's name: ``gpu0``, or ``gpu0,1`` for one pinned to several GPUs."""
    return "gpu" + ",".join(map(str, gpus))


def _serve(connection: Any, gpus: tuple[int, ...] | None) -> None:
    """A local worker process: pinned to ``gpus`` before anything imports CUDA (it sees them as
    cuda:0, cuda:1, ...), then runs ``(fn, args)`` requests one by one, answering ``(ok, value or
    error text)``."""
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    while True:
        try:
            fn, args = connection.recv()
        except EOFError:
            return
        try:
            connection.send((True, fn(*args)))
        except Exception as exc:
            connection.send((False, f"{type(exc).__name__}: {exc}"))


class _LocalWorker:
    def __init__(self, name: str, gpus: tuple[int, ...] | None) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, gpus), name=f"replayfmt-{name}", daemon=True)
        self.process.start()
        child.close()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)


class LocalFanOut(FanOut):
    """One spawned process per GPU, each pinned with CUDA_VISIBLE_DEVICES; an entry of ``gpus``
    that is a tuple of GPUs is one process pinned to all of them (work that needs several GPUs at
    once: a capture of a process that drove several devices)."""

    engine = "local processes"

    def __init__(self, gpus: Iterable[int | tuple[int, ...]], *, pin: bool) -> None:
        sets = [gpu if isinstance(gpu, tuple) else (gpu,) for gpu in gpus]
        self._gpus = {worker_name(each): (each if pin else None) for each in sets}
        self._workers = {name: _LocalWorker(name, gpu) for name, gpu in self._gpus.items()}

    @property
    def workers(self) -> list[str]:
        return list(self._workers)

    def _submit(self, worker: str, task: Task) -> Any:
        handle = self._workers[worker]
        try:
            handle.connection.send((task.fn, task.args))
        except (BrokenPipeError, OSError):
            pass  # it died: the wait sees its pipe closed
        return handle.connection

    def _wait(self, handles: list[Any], timeout: float | None) -> list[Any]:
        return multiprocessing.connection.wait(handles, timeout)  # type: ignore[return-value]

    def _collect(self, handle: Any, worker: str, task: Task) -> tuple[TaskResult, bool]:
        try:
            ok, value = handle.recv()
        except (EOFError, OSError):
            process = self._workers[worker].process
            process.join(5)
            message = f"the worker died (its process ended with exit status {process.exitcode})"
            return TaskResult(task.key, error=message, worker=worker), True
        if ok:
            return TaskResult(task.key, value, worker=worker), False
        return TaskResult(task.key, error=value, worker=worker), False

    def _cancel(self, handle: Any) -> None:
        pass  # the worker is replaced: its process is killed

    def _replace(self, worker: str) -> list[str]:
        self.replaced += 1
        self._workers[worker].stop()
        self._workers[worker] = _LocalWorker(worker, self._gpus[worker])
        return [worker]

    def close(self) -> None:
        for worker in self._workers.values():
            worker.stop()
        self._workers = {}
