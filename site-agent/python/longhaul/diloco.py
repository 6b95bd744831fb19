"""DiLoCo's outer loop on a flat NumPy parameter vector, framework-free.

The caller trains ``params`` (a flat ``float32`` array the inner optimizer
updates in place) and calls :meth:`DiLoCo.step` after every inner step.
Every ``H`` inner steps (the sync planner's, from the agent), each
fragment's pseudo-gradient, the anchor (the parameters the outer step
started from) minus the parameters now, is submitted for the job's round;
the average over the round's live sites comes back and the outer optimizer
(SGD with Nesterov momentum: lr 0.7, momentum 0.9 by default, as DiLoCo)
moves the anchor, which becomes the parameters. Error feedback on the
quantised pseudo-gradients is the agent's (its codec keeps the residual).

Fragments follow the planner's stagger (Streaming DiLoCo): fragment f is
submitted after inner step ``sync_at`` of each outer step (0 meaning the
last, H) and its average applied ``overlap_steps`` (τ) later, or at the
outer step's end, whichever comes first; the local progress made in
between is kept on top of the new anchor, so every inner step counts in
exactly one pseudo-gradient. With τ = 0 (or one fragment synced at the
end) every site holds the same parameters after each outer step.

The schedule (H, τ, the fragments' steps) is taken at the start of each
outer step and holds until its end: the coordinator may re-plan H and τ
from the measured inner step between rounds, and a change reaches this
loop at its next outer step, never in the middle of one.

A round whose average this site did not apply (aborted, this site
excluded from it, or never opened) leaves the anchor and the outer
optimizer where the last applied round put them, and the parameters keep
their local progress: the next pseudo-gradient carries it, over more
inner steps. So the sites of an aborted round, which all keep their
anchor, still share it and end the next committed round with the same
parameters again.

A site excluded from a round the others committed would keep an anchor one
round behind theirs. The next round names it as catching up, after that
round, from a site that applied it: before its first submit of the round
this replica loads that site's anchor and outer momentum
(:meth:`~longhaul.client.Session.catch_up`), keeping its own local
progress on top of the new anchor, and the other site's replica publishes
them (:meth:`~longhaul.client.Session.publish_state`, while its anchor is
still the one after that round). A replica whose catch-up fails sits the
round out (it is asked again in the next one). ``whole_model``, when
given, is called with ``"in"`` before a catch-up rewrites every parameter
and with ``"out"`` after (an adapter that keeps the model elsewhere copies
all of it there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from longhaul.client import CaughtUp, Collected, CollectTimeout, Fragment, LonghaulError, Session


def _lost_round(error: LonghaulError) -> bool:
    """Whether the agent refused because the round is gone or moved on
    (it restarted, the round ended, the job was re-planned): what a loop
    rides out by training on locally."""
    return error.field == "round" and error.code in ("NOT_FOUND", "FAILED_PRECONDITION")


class NesterovSGD:
    """The outer optimizer: ``v = μv + g; θ -= lr (g + μv)`` (Nesterov) or
    ``θ -= lr v`` without it."""

    def __init__(self, size: int, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True):
        if not (lr > 0 and 0 <= momentum < 1):
            raise ValueError(f"lr: must be > 0 and momentum in [0, 1) (got {lr}, {momentum})")
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.velocity = np.zeros(size, dtype=np.float32)

    def apply(self, params: np.ndarray, grad: np.ndarray, where: slice) -> None:
        v = self.velocity[where]
        v *= self.momentum
        v += grad
        step = grad + self.momentum * v if self.nesterov else v
        params[where] -= self.lr * step


@dataclass
class RoundRecord:
    """One outer step as this site saw it."""

    round: int
    applied: List[bool] = field(default_factory=list)
    excluded: bool = False
    live_sites: List[str] = field(default_factory=list)
    hashes: List[str] = field(default_factory=list)
    #: Seconds from the first submit to the last collect.
    exchange_seconds: float = 0.0
    #: Seconds of the whole outer step (H inner steps and the exchange).
    outer_step_seconds: float = 0.0
    #: The site this replica caught up from before the round, and the
    #: round whose state it loaded ("" and 0: no catch-up).
    caught_up_from: str = ""
    caught_up_after: int = 0
    #: Why a catch-up the round asked for failed ("": none failed).
    catch_up_failed: str = ""
    #: H this outer step ran, and the job's inner steps through its round
    #: as the coordinator counts them (0: not known).
    inner_steps: int = 0
    inner_steps_through: int = 0


class DiLoCo:
    """The outer loop of one replica (see the module docs).

    ``session`` is a joined :class:`~longhaul.client.Session`; ``params``
    the flat model the caller trains in place (its size is the job's
    parameter count). ``mode="gradients"`` turns it into synchronous data
    parallelism for a baseline: :meth:`allreduce` averages a gradient every
    step through the same rounds (the job's H must be 1).
    """

    def __init__(
        self,
        session: Session,
        params: np.ndarray,
        *,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        collect_timeout: float = 600.0,
        progress_every: float = 1.0,
        round_wait: float = 30.0,
        whole_model: Optional[Callable[[str], None]] = None,
    ):
        if params.dtype != np.float32 or params.ndim != 1:
            raise ValueError("params: must be a flat float32 array")
        if params.size != session.schedule.parameters:
            raise ValueError(f"params: {params.size} values; the job's schedule has {session.schedule.parameters}")
        self.session = session
        # The schedule of the outer step under way (see the module docs).
        self._schedule = session.schedule
        # The job's inner steps through the round of this outer step.
        self._round_through = 0
        self.params = params
        self.anchor = params.copy()
        self.outer = NesterovSGD(params.size, outer_lr, momentum, nesterov)
        self.collect_timeout = collect_timeout
        #: How long an outer step waits for its round to open before it is
        #: skipped (the job re-planned without rounds, no coordinator).
        self.round_wait = round_wait
        self.progress_every = progress_every
        self.inner_step = 0
        self.round = 0
        self._last_round = 0
        self.history: List[RoundRecord] = []
        #: The round after which the anchor is (0: the start; None: an
        #: outer step applied only some of its fragments).
        self.anchor_round: Optional[int] = 0
        self.whole_model = whole_model
        # The round this replica sits out (its catch-up failed).
        self._sitting_out = 0
        # Fragment -> its parameters when submitted.
        self._submitted: Dict[int, np.ndarray] = {}
        self._record: Optional[RoundRecord] = None
        self._exchange_started = 0.0
        self._outer_started = time.monotonic()
        self._last_progress = 0.0
        # When the last step() returned (None before the first): the time
        # to the next call is the trainer's own inner step, without what
        # longhaul's calls took.
        self._last_step: Optional[float] = None
        #: The inner step as measured (seconds, smoothed; 0 until measured),
        #: which the agent reports to the coordinator for round deadlines.
        self.step_seconds = 0.0

    @property
    def inner_steps(self) -> int:
        """H of the outer step under way."""
        return self._schedule.inner_steps

    def _current_round(self, catch_up: bool = True) -> int:
        # The first round opened after the last one this replica took part
        # in (rounds it missed, excluded or late, are skipped). Nothing of
        # it is applied yet: the anchor is still the one after the round
        # before, which is when a catch-up is served or done.
        if self.round == 0:
            schedule = self.session.wait_for_round(self._last_round, timeout=self.round_wait)
            self.round = schedule.round
            self._round_through = schedule.round_inner_steps_through
            if catch_up:
                self._catch_up(schedule)
        return self.round

    def _catch_up(self, schedule) -> None:
        if schedule.serve_after_round and schedule.serve_after_round == self.anchor_round:
            try:
                self.session.publish_state(self.anchor_round, self.anchor, self.outer.velocity)
            except LonghaulError as error:
                # The round moved on, or the agent lost it (it restarted):
                # no one is served from this state now; train on.
                if not _lost_round(error):
                    raise
        after = schedule.catch_up_after_round
        if not after or after == self.anchor_round:
            return
        record = self._record
        try:
            outcome = self.session.catch_up(after, timeout=self.collect_timeout)
        except CollectTimeout as error:
            # Still being fetched at the timeout: what comes later would be
            # on a stale anchor, so this round is sat out.
            outcome = CaughtUp(False, schedule.catch_up_from_site, f"no state within {self.collect_timeout} s: {error.message}")
        except LonghaulError as error:
            if not _lost_round(error):
                raise
            outcome = CaughtUp(False, schedule.catch_up_from_site, error.message)
        if not outcome.loaded:
            self._sitting_out = self.round
            if record is not None:
                record.catch_up_failed = outcome.reason
            return
        if self.whole_model is not None:
            self.whole_model("in")
        # The local progress since the anchor stays, on the new anchor.
        self.params += outcome.anchor - self.anchor
        self.anchor[:] = outcome.anchor
        self.outer.velocity[:] = outcome.velocity
        self.anchor_round = after
        if self.whole_model is not None:
            self.whole_model("out")
        if record is not None:
            record.caught_up_from, record.caught_up_after = outcome.from_site, after

    def _sync_step(self, fragment) -> int:
        s = fragment.sync_at % self.inner_steps
        return self.inner_steps if s == 0 else s

    def _apply_step(self, fragment) -> int:
        return min(self._sync_step(fragment) + self._schedule.overlap_steps, self.inner_steps)

    def _hand_over(self, round_id: int, fragment: int, values: np.ndarray) -> bool:
        """Submits ``values`` for the round; ``False`` when this site is left
        out of it (excluded, or the round ended without it)."""
        give_up = time.monotonic() + self.collect_timeout
        while True:
            try:
                self.session.submit(round_id, fragment, values)
                return True
            except LonghaulError as error:
                if error.code == "ALREADY_EXISTS" and error.field == "fragment":
                    # An earlier try of this submit reached the agent.
                    return True
                # The round after the last one may take a moment to open.
                if error.code == "NOT_FOUND" and error.field == "round" and time.monotonic() < give_up:
                    time.sleep(0.002)
                    continue
                if error.code == "FAILED_PRECONDITION" and error.field == "round":
                    return False
                raise

    def _submit(self, fragment) -> None:
        where = slice(fragment.first, fragment.first + fragment.size)
        try:
            round_id = self._current_round()
        except LonghaulError as error:
            if error.code != "DEADLINE_EXCEEDED":
                raise
            # No round opened (the coordinator unreachable): train on.
            return
        if self._sitting_out == round_id:
            return
        # After a catch-up, which moves the anchor and the parameters.
        snapshot = self.params[where].copy()
        pseudo = self.anchor[where] - snapshot
        if not self._hand_over(round_id, fragment.index, pseudo):
            return
        if not self._submitted:
            self._exchange_started = time.monotonic()
        self._submitted[fragment.index] = snapshot

    def _apply(self, fragment, record: RoundRecord) -> None:
        where = slice(fragment.first, fragment.first + fragment.size)
        snapshot = self._submitted.pop(fragment.index, None)
        if snapshot is None:
            outcome = Collected(False, True, "", [], "not submitted: this site was left out of the round")
        else:
            try:
                outcome = self.session.collect(record.round, fragment.index, timeout=self.collect_timeout)
            except LonghaulError as error:
                # The agent lost the round (it restarted, or the job was
                # re-planned off this site meanwhile): train on locally.
                if not _lost_round(error):
                    raise
                outcome = Collected(False, False, "", [], error.message)
        record.applied.append(outcome.applied)
        record.hashes.append(outcome.hash)
        if outcome.applied:
            record.live_sites = outcome.live_sites
            self.outer.apply(self.anchor, self.session.result(fragment.index), where)
            # The steps since the submit stay, on top of the new anchor.
            drift = self.params[where] - snapshot
            self.params[where] = self.anchor[where] + drift
        else:
            # The anchor stays; the local progress stays in the parameters
            # for the next pseudo-gradient (see the module docs).
            record.excluded = record.excluded or outcome.excluded

    def due(self) -> List[Fragment]:
        """The fragments the next :meth:`step` submits or applies: the only
        parameters it reads or writes (an adapter that keeps the model
        elsewhere copies just these ranges in before and out after)."""
        step = self.inner_step + 1
        return [
            f for f in self._schedule.fragments if step in (self._sync_step(f), self._apply_step(f))
        ]

    def step(self) -> Optional[RoundRecord]:
        """Call after every inner step; returns the outer step's record when
        one ended with this step."""
        now = time.monotonic()
        if self._last_step is not None:
            # Smoothed, so that one slow step (a checkpoint, a page fault)
            # does not set the deadline of a round.
            sample = now - self._last_step
            self.step_seconds = sample if self.step_seconds == 0.0 else 0.8 * self.step_seconds + 0.2 * sample
        try:
            return self._step(now)
        finally:
            self._last_step = time.monotonic()

    def _step(self, now: float) -> Optional[RoundRecord]:
        self.inner_step += 1
        if now - self._last_progress >= self.progress_every:
            self._last_progress = now
            self.session.progress(self.inner_step, self.step_seconds)
        if self._record is None:
            self._record = RoundRecord(round=0)
        for fragment in self._schedule.fragments:
            if self.inner_step == self._sync_step(fragment):
                self._submit(fragment)
                self._record.round = self.round or self._record.round
            if self.inner_step == self._apply_step(fragment):
                self._apply(fragment, self._record)
        if self.inner_step < self.inner_steps:
            return None
        record, self._record = self._record, None
        record.inner_steps = self.inner_steps
        record.inner_steps_through = self._round_through if record.round == self.round else 0
        # The next outer step runs the schedule as the agent has it now.
        self._schedule = self.session.schedule
        self._round_through = 0
        now = time.monotonic()
        record.exchange_seconds = now - self._exchange_started
        record.outer_step_seconds = now - self._outer_started
        self._outer_started = now
        self.history.append(record)
        if record.applied and all(record.applied):
            self.anchor_round = record.round
        elif any(record.applied):
            self.anchor_round = None
        self.inner_step = 0
        self._last_round, self.round = max(self._last_round, record.round), 0
        return record

    def allreduce(self, grad: np.ndarray) -> Optional[np.ndarray]:
        """Synchronous data parallelism: the average of every live site's
        ``grad`` for this step (one round of H = 1), or ``None`` when this
        site was left out of the round. The caller's optimizer applies it."""
        if self.inner_steps != 1:
            raise ValueError(f"allreduce: the job's H is {self.inner_steps}; synchronous data parallelism needs 1")
        # Synchronous data parallelism keeps no anchor: nothing to catch up.
        round_id = self._current_round(catch_up=False)
        started = time.monotonic()
        out = np.empty_like(grad)
        applied = True
        live: List[str] = []
        for fragment in self.session.schedule.fragments:
            where = slice(fragment.first, fragment.first + fragment.size)
            applied = self._hand_over(round_id, fragment.index, grad[where])
            if applied:
                outcome = self.session.collect(round_id, fragment.index, out[where], timeout=self.collect_timeout)
                applied = outcome.applied
                live = outcome.live_sites
        self.history.append(
            RoundRecord(round=round_id, applied=[applied], live_sites=live, exchange_seconds=time.monotonic() - started)
        )
        self._last_round, self.round = round_id, 0
        return out if applied else None
