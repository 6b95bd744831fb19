"""The trainer API of a longhaul site agent, framework-free.

A :class:`TrainerClient` talks to the agent of this site (a Unix socket, or
TCP loopback); :meth:`TrainerClient.join` makes a :class:`Session` for one
rank of one job. Tensors go through shared memory: the session owns one
file per fragment in the agent's shm directory, copies a pseudo-gradient
into it for :meth:`Session.submit`, and the agent writes the average into it
for :meth:`Session.collect`. Any buffer NumPy can read is accepted. A
site that missed a round catches up with :meth:`Session.catch_up`, from the
state another site's trainer gave with :meth:`Session.publish_state`.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import mmap
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import grpc
import numpy as np

from longhaul.v1 import trainer_pb2 as pb
from longhaul.v1 import trainer_pb2_grpc as pb_grpc

#: The environment variable naming the agent's trainer socket (or address).
SOCKET_ENV = "LONGHAUL_TRAINER_SOCKET"
#: The agent's shared-memory directory unless told otherwise.
DEFAULT_SHM_DIR = "/dev/shm"


class LonghaulError(Exception):
    """A refusal of the agent: ``code`` is the gRPC status code name
    (``INVALID_ARGUMENT``, ``NOT_FOUND``, ...), ``field`` the request field
    the message starts with, when it names one."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        head = message.split(":", 1)[0]
        self.field: Optional[str] = head if " " not in head and head != message else None


class CollectTimeout(LonghaulError):
    """:meth:`Session.collect` waited its whole timeout; call it again."""


def _error(error: grpc.RpcError) -> LonghaulError:
    code = error.code().name if error.code() is not None else "UNKNOWN"
    cls = CollectTimeout if code == "DEADLINE_EXCEEDED" else LonghaulError
    return cls(code, error.details() or "")


@dataclass(frozen=True)
class Fragment:
    """Parameters ``[first, first + size)`` of the flattened model."""

    index: int
    first: int
    size: int
    sync_at: int
    apply_at: int


@dataclass(frozen=True)
class Schedule:
    """What the sync planner decided for the job, and its open round."""

    job_id: str
    inner_steps: int
    overlap_steps: int
    codec_bits: int
    fragments: List[Fragment]
    parameters: int
    #: The job's open round (0: none open now).
    round: int
    participants: List[str]
    #: This site was excluded from ``round``.
    excluded: bool
    last_round_over: int
    #: Before taking part in ``round`` this site catches up: it loads the
    #: state after this round (0: no catch-up) of ``catch_up_from_site``
    #: (:meth:`Session.catch_up`).
    catch_up_after_round: int = 0
    catch_up_from_site: str = ""
    #: A site catches up from this one: publish the state after this round
    #: (0: none asked, or published already; :meth:`Session.publish_state`).
    serve_after_round: int = 0
    #: H of ``round``'s outer step and the job's inner steps through it,
    #: as the coordinator counts them (0: not carried). ``inner_steps`` is
    #: the schedule now, which a re-plan may have changed for later rounds.
    round_inner_steps: int = 0
    round_inner_steps_through: int = 0

    @staticmethod
    def from_wire(message: pb.TrainerSchedule) -> "Schedule":
        return Schedule(
            job_id=message.job_id,
            inner_steps=message.inner_steps,
            overlap_steps=message.overlap_steps,
            codec_bits=message.codec_bits,
            fragments=[
                Fragment(f.fragment, f.first_parameter, f.parameters, f.sync_at_inner_step, f.apply_at_inner_step)
                for f in message.fragments
            ],
            parameters=message.parameters,
            round=message.round,
            participants=list(message.participants),
            excluded=message.excluded,
            last_round_over=message.last_round_over,
            catch_up_after_round=message.catch_up_after_round,
            catch_up_from_site=message.catch_up_from_site,
            serve_after_round=message.serve_after_round,
            round_inner_steps=message.round_inner_steps,
            round_inner_steps_through=message.round_inner_steps_through,
        )


@dataclass(frozen=True)
class Collected:
    """A fragment's outcome: ``applied`` with the average in the buffer
    given to :meth:`Session.collect`, or why this site has none."""

    applied: bool
    excluded: bool
    hash: str
    live_sites: List[str]
    reason: str


@dataclass(frozen=True)
class CaughtUp:
    """A catch-up's outcome: ``loaded`` with the anchor and the outer
    optimizer's momentum of ``from_site`` after the round (copies), or the
    ``reason`` there are none."""

    loaded: bool
    from_site: str
    reason: str
    anchor: Optional[np.ndarray] = None
    velocity: Optional[np.ndarray] = None


class _SharedBuffer:
    """A file in the shm directory, mapped, of ``elements`` f32 values."""

    def __init__(self, directory: str, name: str, elements: int):
        self.name = name
        self.path = os.path.join(directory, name)
        self.elements = elements
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, elements * 4)
            self._map = mmap.mmap(fd, elements * 4)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._map, dtype=np.float32)

    def wire(self, elements: Optional[int] = None) -> pb.SharedTensor:
        return pb.SharedTensor(
            name=self.name, offset=0, dtype=pb.TENSOR_DTYPE_F32, elements=elements or self.elements
        )

    def close(self) -> None:
        self.array = np.empty(0, dtype=np.float32)
        try:
            self._map.close()
        except BufferError:
            pass  # a view of it is still alive; the mapping goes with it
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class TrainerClient:
    """A connection to this site's agent.

    ``target`` is ``unix:/path/to/socket``, a bare socket path, or
    ``127.0.0.1:PORT``; by default the ``LONGHAUL_TRAINER_SOCKET``
    environment variable. ``shm_dir`` must be the agent's ``[trainer]
    shm_dir``.
    """

    def __init__(self, target: Optional[str] = None, *, shm_dir: str = DEFAULT_SHM_DIR, call_timeout: float = 30.0):
        target = target or os.environ.get(SOCKET_ENV)
        if not target:
            raise ValueError(f"target: give the agent's trainer socket, or set {SOCKET_ENV}")
        if target.startswith("/"):
            target = "unix:" + target
        self.target = target
        self.shm_dir = shm_dir
        self.call_timeout = call_timeout
        # A Unix socket's path is no valid HTTP/2 :authority for the agent's
        # server (it resets the stream): name the local host instead.
        self._channel = grpc.insecure_channel(target, options=[("grpc.default_authority", "localhost")])
        self._stub = pb_grpc.TrainerStub(self._channel)

    def _call(self, method: str, request, timeout: Optional[float] = None):
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.call_timeout)
        except grpc.RpcError as error:
            raise _error(error) from None

    def describe(self) -> Dict[str, List[int]]:
        """The jobs placed on this site and the ranks it owns of each."""
        response = self._call("Describe", pb.TrainerDescribeRequest())
        return {job.job_id: list(job.ranks) for job in response.jobs}

    def join(self, job_id: str, rank: int, parameters: int, *, wait: float = 0.0) -> "Session":
        """Joins ``job_id`` as ``rank`` with a model of ``parameters`` values.

        With ``wait`` > 0, a job not yet placed on this site (NOT_FOUND) is
        asked for again until ``wait`` seconds have passed."""
        give_up = time.monotonic() + wait
        while True:
            try:
                response = self._call(
                    "Join", pb.TrainerJoinRequest(job_id=job_id, rank=rank, parameters=parameters, pid=os.getpid())
                )
                return Session(self, response, (job_id, rank, parameters))
            except LonghaulError as error:
                if error.code != "NOT_FOUND" or time.monotonic() >= give_up:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        self._channel.close()


class Session:
    """One joined rank. Keep it alive by calling the agent at least every
    ``ttl`` seconds (every method does); :meth:`leave` releases the rank."""

    _counter = 0

    #: How long a call waits for an agent that went away (restarted, say)
    #: to come back before the error reaches the caller.
    reconnect_timeout: float = 120.0

    def __init__(self, client: TrainerClient, response: pb.TrainerJoinResponse, joined_as=None):
        self.client = client
        self._joined_as = joined_as
        #: How often the session was joined again after the agent lost it.
        self.rejoins = 0
        self.id = response.session
        self.site = response.site_id
        self.ttl = response.session_ttl_ms / 1000.0
        self.schedule = Schedule.from_wire(response.schedule)
        self._buffers: Dict[int, _SharedBuffer] = {}
        self._state: Optional[_SharedBuffer] = None
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        Session._counter += 1
        self._prefix = f"longhaul-{os.getpid()}-{Session._counter}-{time.monotonic_ns()}"
        atexit.register(self._release_buffers)

    def _rpc(self, method: str, request, timeout: Optional[float] = None):
        """``request(session_id)`` sent as ``method``. While the agent is
        unreachable (UNAVAILABLE) the call is tried again, for up to
        :attr:`reconnect_timeout`; when the agent no longer knows the
        session (it restarted) the rank joins again and the call is sent
        with the new session."""
        give_up = time.monotonic() + self.reconnect_timeout
        pause = 0.05
        while True:
            try:
                return self.client._call(method, request(self.id), timeout)
            except LonghaulError as error:
                if time.monotonic() >= give_up or self._joined_as is None:
                    raise
                if error.code == "UNAVAILABLE":
                    time.sleep(pause)
                    pause = min(pause * 2, 1.0)
                elif error.code == "NOT_FOUND" and error.field == "session" and method != "Leave":
                    job_id, rank, parameters = self._joined_as
                    try:
                        response = self.client._call(
                            "Join",
                            pb.TrainerJoinRequest(job_id=job_id, rank=rank, parameters=parameters, pid=os.getpid()),
                        )
                    except LonghaulError as join_error:
                        # The agent may not have its assignment back yet.
                        if join_error.code not in ("NOT_FOUND", "UNAVAILABLE"):
                            raise
                        time.sleep(pause)
                        pause = min(pause * 2, 1.0)
                        continue
                    self.id = response.session
                    self.rejoins += 1
                else:
                    raise

    def _state_buffer(self) -> _SharedBuffer:
        # The anchor, then the outer momentum: twice the parameters.
        if self._state is None:
            self._state = _SharedBuffer(self.client.shm_dir, f"{self._prefix}-state", 2 * self.schedule.parameters)
        return self._state

    def _buffer(self, fragment: int) -> _SharedBuffer:
        if fragment not in self._buffers:
            sizes = {f.index: f.size for f in self.schedule.fragments}
            if fragment not in sizes:
                raise ValueError(f"fragment: {fragment} is not one of the schedule's {sorted(sizes)}")
            self._buffers[fragment] = _SharedBuffer(self.client.shm_dir, f"{self._prefix}-{fragment}", sizes[fragment])
        return self._buffers[fragment]

    def refresh(self) -> Schedule:
        """The schedule and the job's open round, as the agent has them now."""
        self.schedule = Schedule.from_wire(self._rpc("GetSchedule", lambda sid: pb.TrainerScheduleRequest(session=sid)))
        return self.schedule

    def progress(self, inner_step: int, step_seconds: float) -> Schedule:
        """Reports progress (and keeps the session alive)."""
        self.schedule = Schedule.from_wire(
            self._rpc(
                "ReportProgress",
                lambda sid: pb.TrainerProgressRequest(session=sid, inner_step=inner_step, step_seconds=step_seconds),
            )
        )
        return self.schedule

    def wait_for_round(self, after: int, timeout: float = 60.0) -> Schedule:
        """Waits until a round later than ``after`` is open."""
        give_up = time.monotonic() + timeout
        while True:
            schedule = self.refresh()
            if schedule.round > after:
                return schedule
            if time.monotonic() >= give_up:
                raise LonghaulError("DEADLINE_EXCEEDED", f"round: no round after {after} opened within {timeout} s")
            time.sleep(0.005)

    def submit(self, round: int, fragment: int, values) -> None:
        """Hands the agent ``values`` (the fragment's pseudo-gradient, any
        buffer of ``float32``-convertible numbers of the fragment's size)."""
        buffer = self._buffer(fragment)
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        if values.size != buffer.elements:
            raise ValueError(f"values: {values.size} elements; fragment {fragment} has {buffer.elements}")
        np.copyto(buffer.array, values)
        self._rpc(
            "Submit", lambda sid: pb.TrainerSubmitRequest(session=sid, round=round, fragment=fragment, tensor=buffer.wire())
        )

    def collect(self, round: int, fragment: int, out=None, timeout: float = 600.0) -> Collected:
        """Waits for the fragment's average; with ``out`` (a writable f32
        array of the fragment's size) copies it there. The average is also
        in :meth:`result` until the next submit or collect of the fragment."""
        buffer = self._buffer(fragment)
        give_up = time.monotonic() + timeout
        while True:
            # In pieces well inside the session TTL (the agent keeps a
            # waiting session alive, but a piece must end before the RPC's
            # own timeout).
            wait = max(0.0, min(60.0, self.ttl / 2, give_up - time.monotonic()))
            try:
                response = self._rpc(
                    "Collect",
                    lambda sid: pb.TrainerCollectRequest(
                        session=sid, round=round, fragment=fragment, into=buffer.wire(), timeout_ms=int(wait * 1000)
                    ),
                    timeout=wait + self.client.call_timeout,
                )
                break
            except CollectTimeout:
                if time.monotonic() >= give_up:
                    raise
        applied = response.outcome == pb.COLLECT_OUTCOME_APPLIED
        if applied and out is not None:
            np.copyto(out, buffer.array)
        return Collected(
            applied=applied,
            excluded=response.outcome == pb.COLLECT_OUTCOME_EXCLUDED,
            hash=response.hash,
            live_sites=list(response.live_sites),
            reason=response.reason,
        )

    def collect_async(self, round: int, fragment: int, out=None, timeout: float = 600.0) -> "concurrent.futures.Future[Collected]":
        """:meth:`collect` as a future (one worker thread per session)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="longhaul-collect")
        return self._pool.submit(self.collect, round, fragment, out, timeout)

    def publish_state(self, round: int, anchor, velocity) -> None:
        """Hands the agent this replica's state after ``round`` (the
        schedule's ``serve_after_round``) for the site that catches up from
        this one: the anchor and the outer optimizer's momentum, each of
        the job's parameters."""
        buffer = self._state_buffer()
        half = buffer.elements // 2
        for name, values, at in (("anchor", anchor, 0), ("velocity", velocity, half)):
            values = np.asarray(values, dtype=np.float32).reshape(-1)
            if values.size != half:
                raise ValueError(f"{name}: {values.size} elements; the job has {half} parameters")
            np.copyto(buffer.array[at : at + half], values)
        self._rpc(
            "PublishState", lambda sid: pb.TrainerPublishStateRequest(session=sid, round=round, tensor=buffer.wire())
        )

    def catch_up(self, round: int, timeout: float = 600.0) -> CaughtUp:
        """Waits for the state after ``round`` (the schedule's
        ``catch_up_after_round``) the agent fetches from the site this one
        catches up from; ``loaded`` with copies of its anchor and momentum,
        or the reason there are none (then sit the round out)."""
        buffer = self._state_buffer()
        give_up = time.monotonic() + timeout
        while True:
            wait = max(0.0, min(60.0, self.ttl / 2, give_up - time.monotonic()))
            try:
                response = self._rpc(
                    "CatchUp",
                    lambda sid: pb.TrainerCatchUpRequest(
                        session=sid, round=round, into=buffer.wire(), timeout_ms=int(wait * 1000)
                    ),
                    timeout=wait + self.client.call_timeout,
                )
                break
            except CollectTimeout:
                if time.monotonic() >= give_up:
                    raise
        if response.outcome != pb.CATCH_UP_OUTCOME_LOADED:
            return CaughtUp(False, response.from_site, response.reason or "no state")
        half = buffer.elements // 2
        return CaughtUp(
            True, response.from_site, "", buffer.array[:half].copy(), buffer.array[half:].copy()
        )

    def result(self, fragment: int) -> np.ndarray:
        """The fragment's shared buffer (the last average collected)."""
        return self._buffer(fragment).array

    def _release_buffers(self) -> None:
        for buffer in self._buffers.values():
            buffer.close()
        self._buffers.clear()
        if self._state is not None:
            self._state.close()
            self._state = None

    def leave(self) -> None:
        """Releases the rank and the shared buffers."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        try:
            self.client._call("Leave", pb.TrainerLeaveRequest(session=self.id))
        finally:
            self._release_buffers()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.leave()
