"""Unit tests of the PyTorch adapter against the in-process stand-in for
the agent (test_diloco's Hub): it must do exactly what the NumPy outer loop
does to the same inner updates, in any dtype, and refuse a model or an
optimizer that does not fit the job. Skipped where torch is not importable."""

import importlib.util
import threading
import unittest

import numpy as np

from tests.test_diloco import FakeSession, Hub, schedule

HAVE_TORCH = importlib.util.find_spec("torch") is not None
if HAVE_TORCH:
    import torch

    import longhaul.torch
    from longhaul.diloco import DiLoCo


def tiny_model(dtype=None):
    """Linear(3, 4), tanh, Linear(4, 2): 26 parameters in four tensors, so
    fragments of 13 split a parameter."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    return model.to(dtype) if dtype is not None else model


def deltas(site, steps, size):
    """The inner updates site ``site`` makes, step by step."""
    rng = np.random.default_rng(ord(site))
    return [rng.normal(0, 0.1, size).astype(np.float32) for _ in range(steps)]


if HAVE_TORCH:

    class AddDeltas(torch.optim.Optimizer):
        """An inner optimizer that adds the next of a fixed list of flat
        updates to the parameters (the same arithmetic NumPy does)."""

        def __init__(self, params, updates):
            super().__init__(params, {})
            self.updates = iter(updates)

        @torch.no_grad()
        def step(self, closure=None):
            d = torch.from_numpy(next(self.updates))
            at = 0
            for group in self.param_groups:
                for p in group["params"]:
                    n = p.numel()
                    p.add_(d[at : at + n].view_as(p).to(p.dtype))
                    at += n


def run_in_threads(work):
    threads = [threading.Thread(target=w) for w in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
        assert not thread.is_alive(), "a site never finished"


@unittest.skipUnless(HAVE_TORCH, "torch is not importable")
class TorchAdapterTest(unittest.TestCase):
    def torch_sites(self, steps, h, fragments, tau, excluded=None, dtype=None):
        hub = Hub(["a", "b"], excluded)
        sched = schedule(26, fragments, h, tau)
        sites = {}
        for site in "ab":
            model = tiny_model(dtype)
            opt = longhaul.torch.DiLoCo(
                FakeSession(hub, site, sched), model, AddDeltas(model.parameters(), deltas(site, steps, 26)), progress_every=0.0
            )
            sites[site] = (model, opt)

        def train(opt):
            for _ in range(steps):
                opt.zero_grad()
                opt.step()

        run_in_threads([lambda o=opt: train(o) for _, opt in sites.values()])
        return sites

    def numpy_sites(self, steps, h, fragments, tau):
        hub = Hub(["a", "b"])
        sched = schedule(26, fragments, h, tau)
        flat0 = torch.cat([p.detach().reshape(-1) for p in tiny_model().parameters()]).numpy()
        sites = {}
        for site in "ab":
            params = flat0.copy()
            sites[site] = (params, DiLoCo(FakeSession(hub, site, sched), params, progress_every=0.0))

        def train(site, params, loop):
            for d in deltas(site, steps, 26):
                params += d
                loop.step()

        run_in_threads([lambda s=s, p=p, l=l: train(s, p, l) for s, (p, l) in sites.items()])
        return sites

    @staticmethod
    def flat(model):
        return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()]).numpy()

    def test_the_adapter_does_what_the_numpy_loop_does_bit_for_bit(self):
        for fragments, tau in ((1, 0), (2, 0), (2, 1)):
            with self.subTest(fragments=fragments, tau=tau):
                t = self.torch_sites(12, 4, fragments, tau)
                n = self.numpy_sites(12, 4, fragments, tau)
                for site in "ab":
                    np.testing.assert_array_equal(self.flat(t[site][0]), n[site][0])
                self.assertEqual([r.round for r in t["a"][1].history], [1, 2, 3])
                self.assertTrue(all(all(r.applied) for r in t["a"][1].history))

    def test_every_site_holds_the_same_model_after_an_outer_step(self):
        t = self.torch_sites(8, 4, 1, 0)
        np.testing.assert_array_equal(self.flat(t["a"][0]), self.flat(t["b"][0]))

    def test_a_bf16_model_stays_bf16_and_the_sites_agree(self):
        t = self.torch_sites(8, 4, 1, 0, dtype=torch.bfloat16)
        for model, _ in t.values():
            self.assertTrue(all(p.dtype == torch.bfloat16 for p in model.parameters()))
        a, b = self.flat(t["a"][0]), self.flat(t["b"][0])
        self.assertTrue(np.isfinite(a).all())
        np.testing.assert_array_equal(a, b)
        # Not the initial model: the outer steps moved it.
        self.assertFalse(np.array_equal(a, self.flat(tiny_model(torch.bfloat16))))

    def test_an_excluded_site_keeps_its_local_model_and_takes_part_next_time(self):
        t = self.torch_sites(12, 4, 1, 0, excluded={2: "b"})
        (ma, oa), (mb, ob) = t["a"], t["b"]
        self.assertTrue(ob.history[1].excluded)
        self.assertFalse(any(ob.history[1].applied))
        self.assertEqual(oa.history[1].live_sites, ["a"])
        self.assertTrue(all(ob.history[2].applied))
        self.assertEqual(oa.history[2].live_sites, ["a", "b"])

    def test_allreduce_gradients_averages_every_gradient(self):
        hub = Hub(["a", "b"])
        sched = schedule(26, 1, 1)
        sites = []
        for site, value in (("a", 1.0), ("b", 3.0)):
            model = tiny_model()
            opt = longhaul.torch.DiLoCo(FakeSession(hub, site, sched), model, torch.optim.SGD(model.parameters(), lr=0.1))
            for p in model.parameters():
                p.grad = torch.full_like(p, value)
            sites.append((model, opt))
        # The last bias has no gradient at site b: it counts as zero.
        list(sites[1][0].parameters())[-1].grad = None
        results = []
        run_in_threads([lambda o=opt: results.append(o.allreduce_gradients()) for _, opt in sites])
        self.assertEqual(results, [True, True])
        for model, _ in sites:
            grads = [p.grad for p in model.parameters()]
            for g in grads[:-1]:
                torch.testing.assert_close(g, torch.full_like(g, 2.0))
            torch.testing.assert_close(grads[-1], torch.full_like(grads[-1], 0.5))

    def test_a_model_or_optimizer_that_does_not_fit_is_refused_naming_it(self):
        session = FakeSession(Hub(["a"]), "a", schedule(26, 1, 2))
        model = tiny_model()
        with self.assertRaisesRegex(ValueError, "^model: 26 trainable parameters; the job's schedule has 27"):
            longhaul.torch.DiLoCo(
                FakeSession(Hub(["a"]), "a", schedule(27, 1, 2)), model, torch.optim.SGD(model.parameters(), lr=0.1)
            )
        with self.assertRaisesRegex(ValueError, "^inner_optimizer: does not update trainable parameters \\[2, 3\\]"):
            longhaul.torch.DiLoCo(session, model, torch.optim.SGD(model[0].parameters(), lr=0.1))
        with self.assertRaisesRegex(TypeError, "^model: "):
            longhaul.torch.DiLoCo(session, object(), torch.optim.SGD(model.parameters(), lr=0.1))
        with self.assertRaisesRegex(TypeError, "^inner_optimizer: "):
            longhaul.torch.DiLoCo(session, model, object())

    def test_frozen_parameters_are_not_the_jobs(self):
        model = tiny_model()
        model[0].weight.requires_grad_(False)
        self.assertEqual(longhaul.torch.parameter_count(model), 26 - 12)
        session = FakeSession(Hub(["a"]), "a", schedule(14, 1, 2))
        opt = longhaul.torch.DiLoCo(session, model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1))
        frozen = model[0].weight.detach().clone()
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.ones_like(p) if p.requires_grad else None
            opt.step()
        torch.testing.assert_close(model[0].weight.detach(), frozen)
        self.assertTrue(all(opt.history[0].applied))


if __name__ == "__main__":
    unittest.main()
