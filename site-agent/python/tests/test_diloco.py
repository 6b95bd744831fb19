"""Unit tests of the package without an agent: the outer optimizer, the
outer loop against an in-process stand-in for the agent, the shared
buffers, and the error type."""

import os
import tempfile
import threading
import unittest
import unittest.mock
from typing import Dict, List, Tuple

import numpy as np

from longhaul.client import CaughtUp, Collected, CollectTimeout, Fragment, LonghaulError, Schedule, _SharedBuffer
from longhaul.diloco import DiLoCo, NesterovSGD


class Hub:
    """Averages what the stand-in sessions submit, round by round."""

    def __init__(
        self, sites: List[str], excluded: Dict[int, str] = None, aborted=(), catch_ups=None, serve=True, refuse=None
    ):
        self.sites = sites
        # Method name -> the error the agent answers it with.
        self.refuse: Dict[str, LonghaulError] = refuse or {}
        self.excluded = excluded or {}
        # Rounds that end without an average at any site.
        self.aborted = set(aborted)
        # Round -> (the site catching up, after which round, from which).
        self.catch_ups: Dict[int, Tuple[str, int, str]] = catch_ups or {}
        # Whether the agent of the site caught up from serves its state.
        self.serve = serve
        # Round after -> the (anchor, velocity) published.
        self.states: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self.submitted: Dict[Tuple[int, int], Dict[str, np.ndarray]] = {}
        self.changed = threading.Condition()


class FakeSession:
    def __init__(self, hub: Hub, site: str, schedule: Schedule):
        self.hub, self.site, self.schedule = hub, site, schedule
        self.results: Dict[int, np.ndarray] = {}
        self.progress_calls = 0
        self.step_seconds: List[float] = []

    def refresh(self) -> Schedule:
        return self.schedule

    def progress(self, inner_step, step_seconds):
        self.progress_calls += 1
        self.step_seconds.append(step_seconds)
        return self.schedule

    def wait_for_round(self, after, timeout=60.0):
        round = max(after + 1, 1)
        fields = {**self.schedule.__dict__, "round": round}
        site, after_round, source = self.hub.catch_ups.get(round, ("", 0, ""))
        if site == self.site:
            fields.update(catch_up_after_round=after_round, catch_up_from_site=source)
        if source == self.site and after_round not in self.hub.states:
            fields.update(serve_after_round=after_round)
        return Schedule(**fields)

    def publish_state(self, round, anchor, velocity):
        if "publish_state" in self.hub.refuse:
            raise self.hub.refuse["publish_state"]
        with self.hub.changed:
            self.hub.states[round] = (np.array(anchor), np.array(velocity))
            self.hub.changed.notify_all()

    def catch_up(self, round, timeout=600.0):
        if "catch_up" in self.hub.refuse:
            raise self.hub.refuse["catch_up"]
        if not self.hub.serve:
            return CaughtUp(False, "a", "the state after that round is not published")
        with self.hub.changed:
            ok = self.hub.changed.wait_for(lambda: round in self.hub.states, 5.0)
            assert ok, f"the state after round {round} was never published"
            anchor, velocity = self.hub.states[round]
        return CaughtUp(True, "a", "", anchor.copy(), velocity.copy())

    def submit(self, round, fragment, values):
        if self.hub.excluded.get(round) == self.site:
            raise LonghaulError("FAILED_PRECONDITION", f"round: this site was excluded from round {round}")
        with self.hub.changed:
            slot = self.hub.submitted.setdefault((round, fragment), {})
            if self.site in slot:
                raise LonghaulError("ALREADY_EXISTS", "fragment: submitted already")
            slot[self.site] = np.array(values, dtype=np.float32)
            self.hub.changed.notify_all()

    def collect(self, round, fragment, out=None, timeout=600.0):
        """The average once every site not excluded from the round sent."""
        live = sorted(s for s in self.hub.sites if self.hub.excluded.get(round) != s)
        if round in self.hub.aborted:
            return Collected(False, False, "", [], f"round {round} was aborted")
        with self.hub.changed:
            ok = self.hub.changed.wait_for(lambda: len(self.hub.submitted.get((round, fragment), {})) == len(live), 5.0)
            assert ok, f"round {round} fragment {fragment}: the other sites never submitted"
            slot = self.hub.submitted[(round, fragment)]
        average = sum(slot[s] for s in live) / np.float32(len(live))
        self.results[fragment] = average.astype(np.float32)
        if out is not None:
            np.copyto(out, self.results[fragment])
        return Collected(True, False, f"h{round}", live, "")

    def result(self, fragment):
        return self.results[fragment]


def schedule(parameters: int, fragments: int, h: int, tau: int = 0) -> Schedule:
    """As the planner staggers them: fragment i syncs after step i·H/P."""
    size = parameters // fragments
    return Schedule(
        job_id="job",
        inner_steps=h,
        overlap_steps=tau,
        codec_bits=4,
        fragments=[Fragment(i, i * size, size, i * h // fragments, i * h // fragments + tau) for i in range(fragments)],
        parameters=parameters,
        round=1,
        participants=["a", "b"],
        excluded=False,
        last_round_over=0,
    )


class NesterovTest(unittest.TestCase):
    def test_one_step_matches_the_formula(self):
        opt = NesterovSGD(3, lr=0.5, momentum=0.9)
        params = np.array([1.0, 2.0, 3.0], dtype=np.float32)
        grad = np.array([1.0, -1.0, 0.5], dtype=np.float32)
        opt.apply(params, grad, slice(0, 3))
        # v = g; step = g + 0.9 g = 1.9 g
        np.testing.assert_allclose(params, [1.0 - 0.95, 2.0 + 0.95, 3.0 - 0.475], rtol=1e-6)
        opt.apply(params, grad, slice(0, 3))
        # v = 1.9 g; step = g + 0.9 * 1.9 g = 2.71 g
        np.testing.assert_allclose(params[0], 1.0 - 0.95 - 0.5 * 2.71, rtol=1e-6)

    def test_bad_settings_are_refused(self):
        with self.assertRaises(ValueError):
            NesterovSGD(1, lr=0.0)
        with self.assertRaises(ValueError):
            NesterovSGD(1, momentum=1.0)


class OuterLoopTest(unittest.TestCase):
    def run_sites(
        self, excluded=None, steps=12, h=4, fragments=2, tau=0, aborted=(), catch_ups=None, serve=True, refuse=None
    ):
        hub = Hub(["a", "b"], excluded, aborted, catch_ups, serve, refuse)
        sched = schedule(8, fragments, h, tau)
        loops = {}
        for i, site in enumerate(["a", "b"]):
            params = np.full(8, 1.0, dtype=np.float32)
            loops[site] = (params, DiLoCo(FakeSession(hub, site, sched), params, progress_every=0.0))
        errors = []

        def train(site, params, loop):
            rng = np.random.default_rng(ord(site))
            try:
                for _ in range(steps):
                    params -= rng.normal(0, 0.1, 8).astype(np.float32)  # an inner step
                    loop.step()
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append((site, error))

        threads = [threading.Thread(target=train, args=(site, *pair)) for site, pair in loops.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10.0)
        self.assertEqual(errors, [])
        self.assertFalse(any(thread.is_alive() for thread in threads), "a site's loop never ended")
        return loops

    def test_every_site_ends_each_outer_step_with_the_same_parameters(self):
        loops = self.run_sites(fragments=1)
        (pa, la), (pb, _) = loops["a"], loops["b"]
        np.testing.assert_array_equal(pa, pb)
        self.assertEqual(len(la.history), 3)
        self.assertTrue(all(all(r.applied) for r in la.history))
        self.assertEqual(la.history[0].live_sites, ["a", "b"])
        self.assertEqual([r.round for r in la.history], [1, 2, 3])

    def test_staggered_fragments_share_their_anchors_and_submit_once_each(self):
        for tau in (0, 1):
            loops = self.run_sites(fragments=2, tau=tau)
            (pa, la), (pb, lb) = loops["a"], loops["b"]
            np.testing.assert_array_equal(la.anchor, lb.anchor)
            self.assertEqual(sorted(la.session.hub.submitted), [(r, f) for r in (1, 2, 3) for f in (0, 1)])
            # Fragment 0 syncs at the end of the outer step: no drift.
            np.testing.assert_array_equal(pa[:4], pb[:4])

    def test_a_replanned_schedule_takes_effect_at_the_next_outer_step_only(self):
        hub = Hub(["a"])
        params = np.zeros(4, dtype=np.float32)
        before = schedule(4, 1, 4, tau=1)
        after = schedule(4, 1, 2)
        session = FakeSession(hub, "a", before)
        waits = session.wait_for_round

        def wait_and_replan(after_round, timeout=60.0):
            # The coordinator re-plans while the first outer step runs: the
            # agent's schedule changes under the loop.
            got = waits(after_round, timeout)
            session.schedule = after
            return Schedule(**{**got.__dict__, "round_inner_steps": 4, "round_inner_steps_through": 4 * got.round})

        session.wait_for_round = wait_and_replan
        loop = DiLoCo(session, params, progress_every=0.0)
        ended = []
        for step in range(1, 9):
            params -= 1.0
            if loop.step() is not None:
                ended.append(step)
        # H = 4 until the first outer step ends, then H = 2.
        self.assertEqual(ended, [4, 6, 8])
        self.assertEqual([r.inner_steps for r in loop.history], [4, 2, 2])
        self.assertEqual([r.inner_steps_through for r in loop.history], [4, 8, 12])
        self.assertEqual(sorted(hub.submitted), [(1, 0), (2, 0), (3, 0)])
        self.assertTrue(all(all(r.applied) for r in loop.history))

    def test_local_steps_after_a_submit_stay_on_top_of_the_new_anchor(self):
        hub = Hub(["a"])
        params = np.zeros(4, dtype=np.float32)
        # One fragment synced after step 1 of 4, applied 2 steps later.
        sched = Schedule(**{**schedule(4, 1, 4).__dict__, "fragments": [Fragment(0, 0, 4, 1, 3)], "overlap_steps": 2})
        loop = DiLoCo(FakeSession(hub, "a", sched), params, outer_lr=1.0, momentum=0.0)
        for _ in range(4):
            params -= 1.0
            loop.step()
        # Submitted -1 (pseudo-gradient 1) after step 1; at step 3 the
        # anchor moved to -1 and the drift of steps 2-3 (-2) stayed; step 4.
        np.testing.assert_allclose(loop.anchor, -1.0)
        np.testing.assert_allclose(params, -4.0)

    def test_the_first_outer_step_is_the_outer_optimizer_on_the_average(self):
        hub = Hub(["a"])
        params = np.zeros(4, dtype=np.float32)
        loop = DiLoCo(FakeSession(hub, "a", schedule(4, 1, 2)), params, outer_lr=0.5, momentum=0.0)
        params -= 1.0
        loop.step()
        params -= 1.0
        record = loop.step()
        self.assertIsNotNone(record)
        # pseudo-gradient 2; anchor 0 - 0.5 * 2 = -1
        np.testing.assert_allclose(params, -1.0)
        np.testing.assert_allclose(loop.anchor, -1.0)

    def test_an_excluded_site_keeps_its_anchor_and_local_progress_and_goes_on(self):
        loops = self.run_sites(excluded={2: "b"}, steps=8, fragments=1)
        (pa, la), (pb, lb) = loops["a"], loops["b"]
        self.assertFalse(any(lb.history[1].applied))
        self.assertTrue(lb.history[1].excluded)
        self.assertTrue(all(la.history[1].applied))
        self.assertEqual(la.history[1].live_sites, ["a"])
        # b's anchor is still round 1's, its parameters four local steps
        # past it; a's moved on without b.
        rng = np.random.default_rng(ord("b"))
        steps = [rng.normal(0, 0.1, 8).astype(np.float32) for _ in range(8)]
        expected = lb.anchor.copy()
        for step in steps[4:]:
            expected -= step
        np.testing.assert_allclose(pb, expected, rtol=0, atol=1e-6)
        self.assertFalse(np.array_equal(pa, pb))
        self.assertFalse(np.array_equal(la.anchor, lb.anchor))

    def test_a_site_that_missed_a_committed_round_catches_up_and_shares_the_anchor_again(self):
        for fragments, tau in ((1, 0), (2, 1)):
            # b is left out of round 2, which a commits; round 3 names b as
            # catching up after round 2 from a.
            loops = self.run_sites(excluded={2: "b"}, steps=12, fragments=fragments, tau=tau, catch_ups={3: ("b", 2, "a")})
            (pa, la), (pb, lb) = loops["a"], loops["b"]
            self.assertTrue(lb.history[1].excluded)
            record = lb.history[2]
            self.assertEqual((record.caught_up_from, record.caught_up_after), ("a", 2))
            self.assertTrue(all(record.applied))
            self.assertEqual(record.live_sites, ["a", "b"])
            # a published its state after round 2, before round 3 moved it.
            anchor2, velocity2 = la.session.hub.states[2]
            self.assertFalse(np.array_equal(anchor2, la.anchor))
            self.assertTrue(np.any(velocity2 != 0))
            np.testing.assert_array_equal(la.anchor, lb.anchor)
            np.testing.assert_array_equal(la.outer.velocity, lb.outer.velocity)
            self.assertEqual((la.anchor_round, lb.anchor_round), (3, 3))
            if fragments == 1:
                np.testing.assert_array_equal(pa, pb)
            # b's round-3 pseudo-gradient is its eight local steps since
            # round 1: the catch-up moved its anchor and its parameters alike.
            rng = np.random.default_rng(ord("b"))
            steps = [rng.normal(0, 0.1, 8).astype(np.float32) for _ in range(12)]
            if fragments == 1:
                np.testing.assert_allclose(la.session.hub.submitted[(3, 0)]["b"], sum(steps[4:12]), rtol=0, atol=1e-5)

    def test_a_failed_catch_up_sits_the_round_out_and_keeps_the_anchor(self):
        loops = self.run_sites(
            excluded={2: "b", 3: "b"}, steps=12, fragments=1, catch_ups={3: ("b", 2, "a")}, serve=False
        )
        (pa, la), (pb, lb) = loops["a"], loops["b"]
        record = lb.history[2]
        self.assertIn("not published", record.catch_up_failed)
        self.assertEqual(record.caught_up_from, "")
        self.assertNotIn("b", la.session.hub.submitted[(3, 0)])
        self.assertFalse(any(record.applied))
        self.assertEqual(lb.anchor_round, 1)
        self.assertFalse(np.array_equal(la.anchor, lb.anchor))

    def test_a_catch_up_the_agent_times_out_or_refuses_sits_the_round_out(self):
        for refusal in (
            CollectTimeout("DEADLINE_EXCEEDED", "timeout_ms: the state after round 2 of job is still being fetched"),
            LonghaulError("NOT_FOUND", "round: no round of job names this site as catching up after round 2"),
        ):
            loops = self.run_sites(
                excluded={2: "b", 3: "b"}, fragments=1, catch_ups={3: ("b", 2, "a")}, refuse={"catch_up": refusal}
            )
            (_, la), (_, lb) = loops["a"], loops["b"]
            record = lb.history[2]
            self.assertIn(refusal.message.split(": ", 1)[1], record.catch_up_failed)
            # Nothing submitted on the stale anchor; the anchor kept.
            self.assertNotIn("b", la.session.hub.submitted[(3, 0)])
            self.assertFalse(any(record.applied))
            self.assertEqual(lb.anchor_round, 1)

    def test_a_publish_the_agent_refuses_is_skipped_and_the_site_trains_on(self):
        refusal = LonghaulError("FAILED_PRECONDITION", "round: fragment 0 of round 3 of job is applied here already")
        loops = self.run_sites(
            excluded={2: "b", 3: "b"},
            fragments=1,
            catch_ups={3: ("b", 2, "a")},
            serve=False,
            refuse={"publish_state": refusal},
        )
        (_, la), (_, lb) = loops["a"], loops["b"]
        self.assertEqual(la.session.hub.states, {})
        self.assertEqual(len(la.history), 3)
        self.assertTrue(all(all(r.applied) for r in la.history))
        self.assertEqual(la.anchor_round, 3)
        self.assertTrue(lb.history[2].catch_up_failed)

    def test_the_step_time_reported_is_the_trainers_own_smoothed_without_longhauls_calls(self):
        class Clock:
            now = 100.0

            def monotonic(self):
                return self.now

            def sleep(self, seconds):
                self.now += seconds

        clock = Clock()
        hub = Hub(["a"])
        session = FakeSession(hub, "a", schedule(8, 1, 4))
        exchange = session.collect

        def slow_collect(*args, **kwargs):
            clock.now += 50.0  # the exchange: not the trainer's step
            return exchange(*args, **kwargs)

        session.collect = slow_collect
        params = np.ones(8, dtype=np.float32)
        with unittest.mock.patch("longhaul.diloco.time", clock):
            loop = DiLoCo(session, params, progress_every=0.0)
            clock.now += 30.0  # set-up before the first step: not measured
            for seconds in [1.0] * 4 + [3.0] * 4:
                clock.now += seconds  # an inner step
                loop.step()
        # Not measured before the second step; then 1 s, smoothed toward 3 s.
        self.assertEqual(session.step_seconds[:4], [0.0, 1.0, 1.0, 1.0])
        self.assertAlmostEqual(session.step_seconds[4], 0.8 * 1.0 + 0.2 * 3.0)
        self.assertTrue(1.0 < loop.step_seconds < 3.0)
        self.assertEqual(len(loop.history), 2)

    def test_after_an_aborted_round_the_sites_share_one_anchor_again(self):
        # Round 2 ends without an average anywhere; round 3 averages the
        # eight steps since round 1 at both sites.
        loops = self.run_sites(steps=12, fragments=1, aborted={2})
        (pa, la), (pb, lb) = loops["a"], loops["b"]
        self.assertEqual([r.applied for r in la.history], [[True], [False], [True]])
        self.assertFalse(la.history[1].excluded)
        np.testing.assert_array_equal(la.anchor, lb.anchor)
        np.testing.assert_array_equal(pa, pb)
        # The average of round 3 held eight inner steps of each site.
        both = [np.random.default_rng(ord(s)) for s in "ab"]
        steps = [[r.normal(0, 0.1, 8).astype(np.float32) for _ in range(12)] for r in both]
        self.assertEqual(len(la.session.hub.submitted[(3, 0)]), 2)
        for site, site_steps in zip("ab", steps):
            np.testing.assert_allclose(
                la.session.hub.submitted[(3, 0)][site],
                sum(site_steps[4:12]),
                rtol=0, atol=1e-5,
            )

    def test_the_wrong_parameter_count_is_refused(self):
        with self.assertRaises(ValueError):
            DiLoCo(FakeSession(Hub(["a"]), "a", schedule(8, 1, 2)), np.zeros(7, dtype=np.float32))
        with self.assertRaises(ValueError):
            DiLoCo(FakeSession(Hub(["a"]), "a", schedule(8, 1, 2)), np.zeros(8, dtype=np.float64))

    def test_allreduce_averages_every_step(self):
        hub = Hub(["a", "b"])
        sched = schedule(4, 1, 1)
        a = DiLoCo(FakeSession(hub, "a", sched), np.zeros(4, dtype=np.float32))
        b = DiLoCo(FakeSession(hub, "b", sched), np.zeros(4, dtype=np.float32))
        a.session.submit(1, 0, np.full(4, 3.0))
        out = b.allreduce(np.full(4, 1.0, dtype=np.float32))
        np.testing.assert_allclose(out, 2.0)


class SharedBufferTest(unittest.TestCase):
    def test_a_buffer_is_a_file_of_f32_removed_on_close(self):
        with tempfile.TemporaryDirectory() as d:
            buffer = _SharedBuffer(d, "t", 10)
            self.assertEqual(os.path.getsize(os.path.join(d, "t")), 40)
            buffer.array[:] = np.arange(10)
            with open(os.path.join(d, "t"), "rb") as f:
                np.testing.assert_array_equal(np.frombuffer(f.read(), dtype=np.float32), np.arange(10))
            self.assertEqual(buffer.wire().elements, 10)
            with self.assertRaises(FileExistsError):
                _SharedBuffer(d, "t", 10)
            buffer.close()
            self.assertFalse(os.path.exists(os.path.join(d, "t")))


class ErrorTest(unittest.TestCase):
    def test_the_field_is_the_messages_head(self):
        self.assertEqual(LonghaulError("INVALID_ARGUMENT", "tensor.elements: is 5; ...").field, "tensor.elements")
        self.assertIsNone(LonghaulError("UNAVAILABLE", "connection refused").field)


if __name__ == "__main__":
    unittest.main()
