"""A character-level language model trained across sites through longhaul.

A small MLP (8 characters of context, 16-wide embeddings, 256 tanh units,
64 classes: 50,496 parameters) predicts the next character of Python
standard-library source (the text of a fixed list of modules, which ships
with every Python), with Adam as the inner optimizer, in NumPy. Each site
trains on its own shard of the text and every site evaluates on the same
held-out part.

The job's sync schedule decides the mode: with H = 1 every step's gradient
is averaged over the sites (synchronous data parallelism, the baseline);
with H > 1 the replicas train locally and DiLoCo's outer step averages
their pseudo-gradients every H steps. The job ends at a round, as a
DiLoCo job does: the outer step that ends in round ``steps / H`` is the
last one, so a site that lost inner steps to an outage (its later outer
steps go into later rounds) ends in the same round as the others, with
the same parameters, after fewer inner steps of its own.

    python -m longhaul.examples.chars --job chars-diloco --steps 2000 --output out.json

The agent's socket comes from ``--socket`` or ``LONGHAUL_TRAINER_SOCKET``.
The JSON output holds the loss curve, the outer rounds and the timings.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Dict, List, Tuple

import numpy as np

from longhaul.client import TrainerClient
from longhaul.diloco import DiLoCo

CONTEXT, EMBED, HIDDEN, CLASSES = 8, 16, 256, 64
MODULES = ["argparse", "textwrap", "difflib", "shlex", "calendar", "fractions", "string", "heapq", "bisect", "statistics"]


def parameter_count() -> int:
    return CLASSES * EMBED + CONTEXT * EMBED * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES


def corpus() -> str:
    """The text of MODULES' source files, in order."""
    parts = []
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise SystemExit(f"the standard library lacks {name}")
        with open(spec.origin, encoding="utf-8") as file:
            parts.append(file.read())
    return "\n".join(parts)


def encode(text: str) -> np.ndarray:
    """Characters as classes: the 63 most frequent, in a fixed order, and
    one class for every other character."""
    counts: Dict[str, int] = {}
    for ch in text:
        counts[ch] = counts.get(ch, 0) + 1
    kept = sorted(counts, key=lambda c: (-counts[c], c))[: CLASSES - 1]
    index = {c: i for i, c in enumerate(kept)}
    return np.array([index.get(c, CLASSES - 1) for c in text], dtype=np.int64)


class Model:
    """The MLP over one flat parameter vector (views into it)."""

    def __init__(self, params: np.ndarray):
        shapes = [(CLASSES, EMBED), (CONTEXT * EMBED, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,)]
        self.views = []
        at = 0
        for shape in shapes:
            n = int(np.prod(shape))
            self.views.append(params[at : at + n].reshape(shape))
            at += n
        assert at == params.size

    @staticmethod
    def init(rng: np.random.Generator) -> np.ndarray:
        params = np.zeros(parameter_count(), dtype=np.float32)
        m = Model(params)
        emb, w1, _, w2, _ = m.views
        emb[:] = rng.normal(0, 1.0, emb.shape)
        w1[:] = rng.normal(0, 1.0 / np.sqrt(w1.shape[0]), w1.shape)
        w2[:] = rng.normal(0, 1.0 / np.sqrt(w2.shape[0]), w2.shape)
        return params

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray, grad: np.ndarray = None) -> float:
        emb, w1, b1, w2, b2 = self.views
        e = emb[x].reshape(len(x), -1)
        h = np.tanh(e @ w1 + b1)
        logits = h @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        if grad is None:
            return loss
        g = Model(grad).views
        d = p
        d[np.arange(len(y)), y] -= 1
        d /= len(y)
        g[4][:] = d.sum(axis=0)
        g[3][:] = h.T @ d
        dh = (d @ w2.T) * (1 - h * h)
        g[2][:] = dh.sum(axis=0)
        g[1][:] = e.T @ dh
        de = (dh @ w1.T).reshape(len(x), CONTEXT, EMBED)
        g[0][:] = 0
        np.add.at(g[0], x, de)
        return loss


class Adam:
    def __init__(self, size: int, lr: float = 3e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.m = np.zeros(size, dtype=np.float32)
        self.v = np.zeros(size, dtype=np.float32)
        self.t = 0

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        mh = self.m / (1 - self.b1**self.t)
        vh = self.v / (1 - self.b2**self.t)
        params -= (self.lr * mh / (np.sqrt(vh) + self.eps)).astype(np.float32)


def batches(data: np.ndarray, batch: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - CONTEXT - 1, batch)
        x = np.stack([data[s : s + CONTEXT] for s in starts])
        y = data[starts + CONTEXT]
        yield x, y


def split(data: np.ndarray, sites: int, shard: int) -> Tuple[np.ndarray, np.ndarray]:
    """The site's training shard and the common held-out set: every tenth
    block of 512 characters is held out; the rest is cut into one
    contiguous shard per site."""
    block = 512
    blocks = [data[i : i + block] for i in range(0, len(data) - block + 1, block)]
    test = np.concatenate([b for i, b in enumerate(blocks) if i % 10 == 9])
    train = np.concatenate([b for i, b in enumerate(blocks) if i % 10 != 9])
    size = len(train) // sites
    return train[shard * size : (shard + 1) * size], test


def _log(session, step: int, loss: float, held_out: float, started: float, curve: List[dict]) -> None:
    curve.append({"step": step, "train_loss": loss, "held_out_loss": held_out, "seconds": time.monotonic() - started})
    print(f"{session.site} step {step} loss {loss:.3f} held-out {held_out:.3f}", flush=True)


def _train_numpy(args, session, source, held, started):
    """The model and Adam in NumPy, the outer loop longhaul.diloco's."""
    rng = np.random.default_rng(args.seed)
    params = Model.init(rng)
    model = Model(params)
    grad = np.zeros_like(params)
    inner = Adam(params.size, lr=args.lr)
    loop = DiLoCo(session, params, outer_lr=args.outer_lr, momentum=args.outer_momentum)
    sync_dp = session.schedule.inner_steps == 1
    curve: List[dict] = []
    step_time = 0.0
    last_round = _last_round(args, session)
    for step in range(1, args.steps + 1):
        x, y = next(source)
        t0 = time.perf_counter()
        loss = model.loss_and_grad(x, y, grad)
        if sync_dp:
            average = loop.allreduce(grad)
            inner.step(params, grad if average is None else average)
        else:
            inner.step(params, grad)
        step_time += time.perf_counter() - t0
        ended = not sync_dp and _ends_training(loop.step(), last_round, args.steps)
        if step % args.eval_every == 0 or step == args.steps or ended:
            _log(session, step, loss, model.loss_and_grad(*held), started, curve)
        if ended:
            break
    return curve, loop.history, params.tobytes(), step_time, step


def _last_round(args, session) -> int:
    """The job's last round at the H it starts with: the outer step of
    ``steps`` inner steps."""
    return max(1, args.steps // max(1, session.schedule.inner_steps))


def _ends_training(record, last_round: int, steps: int) -> bool:
    """Whether the outer step that just ended (``record``) was the job's
    last: the one whose round brings the job's inner steps, as the
    coordinator counts them (whatever H each round had after a re-plan),
    to ``steps``; by round number where the count is not carried. Every
    site ends in the same round, a site that lost steps to an outage
    too."""
    if record is None:
        return False
    if record.inner_steps_through:
        return record.inner_steps_through >= steps
    return record.round >= last_round


def _train_torch(args, session, source, held, started):
    """The same model in PyTorch (an embedding, a tanh layer, a linear
    head: the same 50,496 parameters), Adam as the inner optimizer, the
    outer loop longhaul.torch's."""
    import torch

    import longhaul.torch

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Embedding(CLASSES, EMBED),
        torch.nn.Flatten(),
        torch.nn.Linear(CONTEXT * EMBED, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )
    optimizer = longhaul.torch.DiLoCo(
        session,
        model,
        torch.optim.Adam(model.parameters(), lr=args.lr),
        outer_lr=args.outer_lr,
        momentum=args.outer_momentum,
    )
    sync_dp = session.schedule.inner_steps == 1
    loss_fn = torch.nn.CrossEntropyLoss()
    test_x, test_y = (torch.from_numpy(a) for a in held)
    curve: List[dict] = []
    step_time = 0.0
    last_round = _last_round(args, session)
    for step in range(1, args.steps + 1):
        x, y = (torch.from_numpy(a) for a in next(source))
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if sync_dp:
            optimizer.allreduce_gradients()
            optimizer.sync_step()
        step_time += time.perf_counter() - t0
        ended = not sync_dp and _ends_training(optimizer.step(), last_round, args.steps)
        if step % args.eval_every == 0 or step == args.steps or ended:
            with torch.no_grad():
                held_out = float(loss_fn(model(test_x), test_y))
            _log(session, step, float(loss), held_out, started, curve)
        if ended:
            break
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return curve, optimizer.history, flat.numpy().tobytes(), step_time, step


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=None, help="the agent's trainer socket (default: $LONGHAUL_TRAINER_SOCKET)")
    parser.add_argument("--shm-dir", default="/dev/shm", help="the agent's [trainer] shm_dir")
    parser.add_argument("--job", default=os.environ.get("LONGHAUL_JOB"), help="the job id (default: $LONGHAUL_JOB)")
    parser.add_argument("--rank", type=int, default=None, help="the rank to join as (default: the site's first)")
    parser.add_argument("--steps", type=int, default=2000, help="inner steps in all (the token budget); with DiLoCo the outer step that ends in round steps/H is the last")
    parser.add_argument("--batch", type=int, default=32, help="sequences per inner step at this site")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate (inner optimizer)")
    parser.add_argument(
        "--outer-lr", type=float, default=0.7, help="DiLoCo's outer learning rate (Nesterov SGD)"
    )
    parser.add_argument(
        "--outer-momentum",
        type=float,
        default=0.5,
        help="the outer momentum: 0.5, not DiLoCo's 0.9, which needs more outer steps than a run this short has",
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("LONGHAUL_SEED", "0")), help="model init seed (the same at every site)")
    parser.add_argument("--eval-every", type=int, default=100, help="inner steps between held-out evaluations")
    parser.add_argument("--output", default=os.environ.get("LONGHAUL_OUTPUT"), help="write the run as JSON here (default: $LONGHAUL_OUTPUT)")
    parser.add_argument(
        "--framework",
        choices=["numpy", "torch"],
        default="numpy",
        help="train the model in NumPy (longhaul.diloco) or in PyTorch (longhaul.torch; needs torch)",
    )
    parser.add_argument("--join-wait", type=float, default=60.0, help="seconds to wait for the job to be placed here")
    args = parser.parse_args(argv)
    if not args.job:
        parser.error("--job: give the job id (or set LONGHAUL_JOB)")
    if args.framework == "torch" and importlib.util.find_spec("torch") is None:
        parser.error("--framework: torch is not importable by this Python (pip install torch, or use numpy)")

    client = TrainerClient(args.socket, shm_dir=args.shm_dir)
    session = None
    give_up = time.monotonic() + args.join_wait
    while session is None:
        ranks = client.describe().get(args.job, [])
        if ranks or time.monotonic() > give_up:
            rank = args.rank if args.rank is not None else (ranks[0] if ranks else 0)
            session = client.join(args.job, rank, parameter_count(), wait=max(0.0, give_up - time.monotonic()))
        else:
            time.sleep(0.2)
    schedule = session.schedule
    sites = sorted(schedule.participants) or [session.site]
    shard = sites.index(session.site) if session.site in sites else 0
    data = encode(corpus())
    train, test = split(data, len(sites), shard)
    data_rng = np.random.default_rng([args.seed, shard])
    source = batches(train, args.batch, data_rng)
    eval_rng = np.random.default_rng([args.seed, 1_000_003])
    held = next(batches(test, 2048, eval_rng))
    run = _train_torch if args.framework == "torch" else _train_numpy
    started = time.monotonic()
    curve, history, params_bytes, step_time, steps = run(args, session, source, held, started)
    result = {
        "site": session.site,
        "job": args.job,
        "mode": "sync-dp" if schedule.inner_steps == 1 else "diloco",
        "inner_steps": schedule.inner_steps,
        "fragments": len(schedule.fragments),
        "codec_bits": schedule.codec_bits,
        "parameters": parameter_count(),
        "steps": steps,
        "step_budget": args.steps,
        "batch": args.batch,
        "seed": args.seed,
        "outer_lr": args.outer_lr,
        "outer_momentum": args.outer_momentum,
        "seconds": time.monotonic() - started,
        "compute_seconds": step_time,
        "final_held_out_loss": curve[-1]["held_out_loss"],
        "curve": curve,
        "framework": args.framework,
        "rounds": [
            {
                "round": r.round,
                "applied": all(r.applied),
                "excluded": r.excluded,
                "live_sites": r.live_sites,
                "hash": r.hashes[0] if r.hashes else "",
                "exchange_seconds": r.exchange_seconds,
                "outer_step_seconds": r.outer_step_seconds,
                "caught_up_from": r.caught_up_from,
                "caught_up_after": r.caught_up_after,
                "catch_up_failed": r.catch_up_failed,
                "inner_steps": r.inner_steps,
                "inner_steps_through": r.inner_steps_through,
            }
            for r in history
        ],
        "params_sha256": hashlib.sha256(params_bytes).hexdigest(),
    }
    if args.output:
        tmp = args.output + ".tmp"
        with open(tmp, "w") as file:
            json.dump(result, file)
        os.replace(tmp, args.output)
    session.leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
