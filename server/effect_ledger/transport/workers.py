"""``effect-ledger serve --workers N``: N server processes on one port, and their supervisor.

One grpc.aio process keeps one core busy at most (README, Performance). With N > 1, ``serve``
becomes a supervisor that starts N workers. Each worker is a whole server: its own event loop,
its own database pool (``--database-pool-size`` connections each), its own policy engine and
its own grpc.health.v1 service. They share the listening port through SO_REUSEPORT: the kernel
spreads new connections over the listening workers, and a connection stays with the worker
that accepted it, so a health check answers for the worker it reached.

- Workers are new processes (``python -m effect_ledger serve ... --worker-index I``), never
  forks: a process that has imported grpc must not fork. A worker parses the supervisor's own
  command line (and inherits its environment and working directory) with a few flags appended
  after it, so it is configured exactly like the supervisor: the TLS flags too (each worker
  reads the certificate files itself and serves TLS on the shared port; one whose files fail
  to load exits before serving, like any worker that cannot start, see Restarts below).
- The supervisor migrates the database once, before any worker starts; workers never migrate.
- Each worker holds one end of a socket pair with the supervisor. The supervisor writes the
  address to listen on there (and, with ``--health-listen``, the health port's after a space),
  the worker answers with its bound port (and its health port) once it serves, and it
  shuts down gracefully when the supervisor's end closes (the supervisor died, even by
  SIGKILL), so no worker outlives its supervisor by more than its grace period.
- Port 0: all workers start at once, but only worker 0 is told to bind ``--listen`` as given;
  the others, and every replacement, are told the port it bound (the health port alike).
  ``--port-file`` is written once every worker serves.
- The health port (``--health-listen``): every worker serves grpc.health.v1 there as well,
  shared through SO_REUSEPORT like the main port, each answering with its own health.
- Signals: SIGTERM and SIGINT stop every worker (each drains for ``--grace-seconds``; one still
  running after that and STOP_MARGIN_SECONDS more is killed). SIGHUP is forwarded to every
  worker that serves, and each reloads its policy (a worker still starting loads the files as
  they are). Workers run in a process group of their own, so a terminal's Ctrl-C reaches the
  supervisor only and each worker is told once.
- Restarts: a worker that exits while the supervisor is not stopping is started again, after
  a delay that doubles with each restart of that worker in the last RESTART_WINDOW_SECONDS;
  when it exits again after RESTARTS_MAX restarts in that window, the supervisor stops every
  worker and exits 1 (a crash loop is for the service manager to see). A worker that cannot start at all
  (bad configuration, a port taken since the supervisor found it free) makes the supervisor stop
  the others and exit 1 at once.
- A port already in use: the supervisor binds a probe socket of its own (without SO_REUSEPORT)
  before it starts any worker, and stops at once, exit 2, when the probe cannot bind, as a lone
  server does; the health port is checked the same way. Without the check the workers of a second supervisor would join the first's
  port through SO_REUSEPORT (the kernel allows it to processes of the same user).
- The lease sweeper runs in worker 0 only, and in its replacement: one sweeper per host. So
  does the sampler of the ledger's gauges (``--metrics-listen``).
- Metrics (``--metrics-listen``): the supervisor makes a folder, names it to its workers in
  PROMETHEUS_MULTIPROC_DIR, and serves the endpoint, which adds up what the workers wrote there
  (prometheus-client's multiprocess mode); a worker that exits is marked dead there, so its
  gauges stop counting (its counters keep what they counted). The folder is removed on exit.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from effect_ledger.transport.ports import check_port_free

if TYPE_CHECKING:  # for the types only: the supervisor needs none of these modules
    from effect_ledger.config import ServerSettings
    from effect_ledger.policy.engine import PolicyEngine
    from effect_ledger.storage.engine import Database

log = logging.getLogger(__name__)

# A sanity bound on --workers: each worker keeps --database-pool-size connections.
WORKERS_MAX = 64
# Imports, the policy, the database pool and the bind; a worker that takes longer is killed.
WORKER_START_TIMEOUT_SECONDS = 60.0
# After --grace-seconds, how long a stopping worker may still take to close its pool and exit.
STOP_MARGIN_SECONDS = 5.0
RESTARTS_MAX = 5
RESTART_WINDOW_SECONDS = 60.0
RESTART_DELAY_FIRST_SECONDS = 0.1
RESTART_DELAY_MAX_SECONDS = 5.0
# The messages on a worker's channel: the addresses to listen on (supervisor to worker), the
# ports bound (worker to supervisor), separated by a space, each message with a newline.
MESSAGE_SIZE_MAX_BYTES = 512

# (worker index, the worker's channel file descriptor) -> its argv.
WorkerCommand = Callable[[int, int], list[str]]


def default_worker_count() -> int:
    """One worker per CPU this process may run on (its affinity mask), at least one and at most
    WORKERS_MAX.

    A container's CPU quota (cgroup ``cpu.max``) is not an affinity mask: there, say
    ``--workers`` explicitly."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this platform
        cpus = os.cpu_count() or 1
    return min(max(1, cpus), WORKERS_MAX)


def with_port(listen: str, port: int) -> str:
    """``127.0.0.1:0`` with port 50123 -> ``127.0.0.1:50123`` (IPv6 ``[::]:0`` alike)."""
    host, separator, _ = listen.rpartition(":")
    return f"{host}:{port}" if separator else listen


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"status {returncode}"


class WorkerFailed(Exception):
    """A worker exited, or did not answer, before it served."""


@dataclass
class Worker:
    index: int
    process: asyncio.subprocess.Process
    # The supervisor's end of the socket pair: the address to listen on goes out, the worker's
    # port comes back, and its closing (the supervisor's death) tells the worker to stop.
    channel: socket.socket
    serving: bool = False

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def signal(self, signum: int) -> None:
        if self.running:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:  # exited since the check, not yet reaped
                pass


class Supervisor:
    def __init__(
        self,
        command: WorkerCommand,
        count: int,
        listen: str,
        port_file: str,
        grace_seconds: float,
        metrics_folder: str | None = None,
        health_listen: str = "",
    ) -> None:
        assert 1 < count <= WORKERS_MAX
        self.command = command
        self.metrics_folder = metrics_folder
        self.count = count
        # The main port's address first, then the health port's when there is one.
        self.listen = [listen, health_listen] if health_listen else [listen]
        self.port_file = port_file
        self.grace_seconds = grace_seconds
        self.workers: dict[int, Worker] = {}
        self.restarts: dict[int, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.stopping = False
        self.stop_requested = asyncio.Event()
        self.gave_up = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._request_stop, signum)
        loop.add_signal_handler(signal.SIGHUP, self._forward_reload)
        startup = asyncio.create_task(self._start_all())
        stop_wait = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({startup, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not startup.done():  # told to stop while starting
            await _cancel(startup)
            await self._stop_all()
            return 0
        try:
            addresses, port = startup.result()
        except WorkerFailed as error:
            log.error("%s; stopping the other workers", error)
            await _cancel(stop_wait)
            await self._stop_all()
            return 1
        if self.port_file:
            Path(self.port_file).write_text(f"{port}\n")
        log.info("%d workers serving on %s", self.count, " and ".join(addresses))
        watchers = [asyncio.create_task(self._keep(index, addresses)) for index in range(self.count)]
        gave_up_wait = asyncio.create_task(self.gave_up.wait())
        await asyncio.wait({stop_wait, gave_up_wait}, return_when=asyncio.FIRST_COMPLETED)
        await _cancel(*watchers, stop_wait, gave_up_wait)
        await self._stop_all()
        return 0 if self.stop_requested.is_set() else 1

    async def _start_all(self) -> tuple[list[str], int]:
        """Start every worker at once; the addresses they serve on, and the main port."""
        workers = [await self._spawn(index) for index in range(self.count)]
        ports = await self._serve(workers[0], self.listen)
        addresses = [with_port(listen, port) for listen, port in zip(self.listen, ports, strict=True)]
        others = [asyncio.create_task(self._serve(worker, addresses)) for worker in workers[1:]]
        try:
            await asyncio.gather(*others)
        finally:
            await _cancel(*others)  # after a failure: the rest are stopped by _stop_all
        return addresses, ports[0]

    async def _spawn(self, index: int) -> Worker:
        supervisor_end, worker_end = socket.socketpair()
        supervisor_end.setblocking(False)
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(index, worker_end.fileno()),
                stdin=subprocess.DEVNULL,
                pass_fds=(worker_end.fileno(),),
                process_group=0,
            )
        except BaseException:
            supervisor_end.close()
            raise
        finally:
            worker_end.close()
        worker = Worker(index, process, supervisor_end)
        self.workers[index] = worker
        log.info("worker %d started (pid %d)", index, process.pid)
        return worker

    async def _serve(self, worker: Worker, listen: list[str]) -> list[int]:
        """Tell ``worker`` to listen on the addresses ``listen``; its ports once it serves."""
        index, process = worker.index, worker.process
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(worker.channel, f"{' '.join(listen)}\n".encode())
        except OSError:  # it exited already: the read below says how
            pass
        try:
            line = await asyncio.wait_for(_read_line(worker.channel), WORKER_START_TIMEOUT_SECONDS)
        except TimeoutError:
            worker.signal(signal.SIGKILL)
            await process.wait()
            raise WorkerFailed(
                f"worker {index} (pid {process.pid}) did not serve within {WORKER_START_TIMEOUT_SECONDS:g} s"
            ) from None
        ports = line.split(" ")
        if len(ports) != len(listen) or not all(port.isdigit() for port in ports):
            # It closed its end: it is exiting (or said something else).
            try:
                await asyncio.wait_for(process.wait(), STOP_MARGIN_SECONDS)
            except TimeoutError:
                worker.signal(signal.SIGKILL)
                await process.wait()
            how = describe_exit(process.returncode)
            raise WorkerFailed(f"worker {index} (pid {process.pid}) exited with {how} before serving")
        worker.serving = True
        return [int(port) for port in ports]

    async def _keep(self, index: int, address: list[str]) -> None:
        """Start worker ``index`` again whenever it exits, within the restart budget."""
        try:
            await self._restart_on_exit(index, address)
        except Exception:
            log.exception("supervising worker %d failed: giving up", index)
            self.gave_up.set()

    async def _restart_on_exit(self, index: int, address: list[str]) -> None:
        while True:
            worker = self.workers[index]
            await worker.process.wait()
            worker.channel.close()
            self._forget_metrics(worker)
            if self.stopping:
                return
            delay = self._restart_delay(index)
            if delay is None:
                log.error(
                    "worker %d (pid %d) exited with %s after %d restarts within %g s: giving up",
                    index,
                    worker.process.pid,
                    describe_exit(worker.process.returncode),
                    RESTARTS_MAX,
                    RESTART_WINDOW_SECONDS,
                )
                self.gave_up.set()
                return
            log.warning(
                "worker %d (pid %d) exited with %s; starting another in %.1f s",
                index,
                worker.process.pid,
                describe_exit(worker.process.returncode),
                delay,
            )
            await asyncio.sleep(delay)
            try:
                await self._serve(await self._spawn(index), address)
            except WorkerFailed as error:  # counted as one more exit on the next pass
                log.error("%s", error)

    def _forget_metrics(self, worker: Worker) -> None:
        if self.metrics_folder is not None:
            from effect_ledger.observability.metrics import worker_exited

            worker_exited(self.metrics_folder, worker.process.pid)

    def _restart_delay(self, index: int) -> float | None:
        """None when worker ``index`` was restarted RESTARTS_MAX times within the window."""
        now = time.monotonic()
        recent = self.restarts[index]
        while recent and now - recent[0] > RESTART_WINDOW_SECONDS:
            recent.popleft()
        if len(recent) >= RESTARTS_MAX:
            return None
        recent.append(now)
        return min(RESTART_DELAY_MAX_SECONDS, RESTART_DELAY_FIRST_SECONDS * 2 ** (len(recent) - 1))

    def _request_stop(self, signum: int) -> None:
        if not self.stopping:
            name = signal.Signals(signum).name
            log.info("%s: stopping %d workers (grace %.1f s)", name, self.count, self.grace_seconds)
        self.stopping = True
        self.stop_requested.set()

    def _forward_reload(self) -> None:
        serving = [worker for worker in self.workers.values() if worker.serving and worker.running]
        log.info("SIGHUP: reloading the policy in %d workers", len(serving))
        for worker in serving:
            worker.signal(signal.SIGHUP)

    async def _stop_all(self) -> None:
        self.stopping = True
        workers = list(self.workers.values())
        for worker in workers:
            worker.signal(signal.SIGTERM)
        waits = asyncio.gather(*(worker.process.wait() for worker in workers))
        try:
            await asyncio.wait_for(waits, self.grace_seconds + STOP_MARGIN_SECONDS)
        except TimeoutError:
            for worker in workers:
                if worker.running:
                    pid = worker.process.pid
                    log.error("worker %d (pid %d) still running after its grace: killed", worker.index, pid)
                    worker.signal(signal.SIGKILL)
            await asyncio.gather(*(worker.process.wait() for worker in workers))
        for worker in workers:
            worker.channel.close()
        log.info("every worker stopped")


async def _cancel(*tasks: asyncio.Task) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _read_line(channel: socket.socket) -> str:
    """One line from the other end (non-blocking socket); "" when it closed its end first."""
    loop = asyncio.get_running_loop()
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = await loop.sock_recv(channel, MESSAGE_SIZE_MAX_BYTES)
        except ConnectionResetError:  # it exited with our message unread
            return ""
        if not chunk:
            return ""
        data += chunk
        if len(data) > MESSAGE_SIZE_MAX_BYTES:
            return ""
    return data.decode("utf-8", errors="replace").strip()


def supervise(
    command: WorkerCommand,
    count: int,
    listen: str,
    port_file: str,
    grace_seconds: float,
    metrics_listen: str = "",
    health_listen: str = "",
) -> int:
    """Run ``count`` workers until SIGTERM or SIGINT; the process's exit status. With
    ``metrics_listen``, serve the workers' metrics there; with ``health_listen``, the workers
    serve grpc.health.v1 there too. CannotListen, before any worker starts, when a port is
    already in use (by another program, or shared through SO_REUSEPORT by the workers of
    another supervisor, which these would otherwise join)."""
    check_port_free(listen)
    if health_listen:
        check_port_free(health_listen, "--health-listen")

    async def main(metrics_folder: str | None) -> int:
        return await Supervisor(
            command, count, listen, port_file, grace_seconds, metrics_folder, health_listen=health_listen
        ).run()

    if not metrics_listen:
        return asyncio.run(main(None))
    from effect_ledger.observability.metrics import supervisor_endpoint

    with supervisor_endpoint(metrics_listen) as folder:
        return asyncio.run(main(folder))


# --- in a worker ---------------------------------------------------------------------------


async def serve_worker(
    settings: ServerSettings,
    database: Database,
    policy: PolicyEngine,
    reload_policy: Callable[[], None] | None,
    index: int,
    channel_fd: int,
) -> None:
    """Serve as worker ``index`` until SIGTERM, SIGINT or the supervisor's end closing."""
    from effect_ledger.transport.server import start_server  # grpc: workers only

    channel = socket.socket(fileno=channel_fd)
    channel.setblocking(False)
    listen, _, health_listen = (await _read_line(channel)).partition(" ")
    if not listen:
        raise SystemExit("the supervisor went away before naming an address to listen on")
    settings = dataclasses.replace(settings, listen=listen, health_listen=health_listen)
    running = await start_server(
        settings, database, policy, reuse_port=True, sweep_leases=index == 0, serve_metrics=False
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # Always handled: SIGHUP's default action would end the worker.
    loop.add_signal_handler(signal.SIGHUP, reload_policy or _reload_unsupported)
    ports = [running.port] if running.health_port is None else [running.port, running.health_port]
    await loop.sock_sendall(channel, f"{' '.join(map(str, ports))}\n".encode("ascii"))
    loop.add_reader(channel, _on_supervisor_readable, channel, stop)
    log.info(
        "worker %d (pid %d) serving on port %d%s%s",
        index,
        os.getpid(),
        running.port,
        "" if running.health_port is None else f", health on port {running.health_port}",
        ", running the lease sweeper" if index == 0 else "",
    )
    await stop.wait()
    loop.remove_reader(channel)
    log.info("shutting down (grace %.1f s)", settings.grace_seconds)
    await running.stop(settings.grace_seconds)
    channel.close()


def _on_supervisor_readable(channel: socket.socket, stop: asyncio.Event) -> None:
    try:
        data = channel.recv(MESSAGE_SIZE_MAX_BYTES)
    except BlockingIOError:
        return
    except OSError:
        data = b""
    if not data and not stop.is_set():
        log.warning("the supervisor is gone: shutting down")
        asyncio.get_running_loop().remove_reader(channel)
        stop.set()


def _reload_unsupported() -> None:
    log.info("SIGHUP ignored: the policy is evaluated by a remote OPA server, which reloads it itself")
