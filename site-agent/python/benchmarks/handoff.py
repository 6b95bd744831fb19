"""The trainer API's hand-off cost on this machine, beside memcpy.

Starts the agent's echo example (a trainer service whose rounds return
what was submitted; `site-agent/examples/trainer_echo.rs`), then times,
for a fragment of ``--elements`` f32 values (default 2^28, 1 GiB):
``Session.submit`` (the copy into shared memory, the RPC, the agent's
read), ``Session.collect`` (the agent's write, the RPC, the copy out) and
``np.copyto`` of the same buffer, each ``--reps`` times in one run; and
what ``DiLoCo.step`` costs per inner step when no round is due. Prints
medians.

    cargo build --release -p longhaul-site-agent --example trainer_echo
    python3 site-agent/python/benchmarks/handoff.py --echo target/release/examples/trainer_echo
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from longhaul import DiLoCo, TrainerClient  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--echo", required=True, help="the trainer_echo example binary")
    parser.add_argument("--elements", type=int, default=1 << 28)
    parser.add_argument("--reps", type=int, default=10, help="submits and collects timed (the first three allocate the agent's buffers)")
    parser.add_argument("--steps", type=int, default=20000, help="inner steps timed for the per-step cost")
    args = parser.parse_args()
    socket = os.path.join(tempfile.mkdtemp(prefix="lh-echo-"), "trainer.sock")
    agent = subprocess.Popen([args.echo, "--socket", socket, "--elements", str(args.elements), "--inner-steps", str(10**9)])
    try:
        for _ in range(100):
            if os.path.exists(socket):
                break
            time.sleep(0.05)
        client = TrainerClient(socket, call_timeout=120.0)
        session = client.join("echo", 0, args.elements)
        values = np.random.default_rng(1).standard_normal(args.elements, dtype=np.float32)
        out = np.empty_like(values)
        submit, collect, memcpy = [], [], []
        for rep in range(1, args.reps + 1):
            t = time.perf_counter()
            session.submit(rep, 0, values)
            submit.append(time.perf_counter() - t)
            t = time.perf_counter()
            result = session.collect(rep, 0, out)
            collect.append(time.perf_counter() - t)
            assert result.applied and np.array_equal(out, values)
            t = time.perf_counter()
            np.copyto(out, values)
            memcpy.append(time.perf_counter() - t)
        gib = args.elements * 4 / 2**30
        print(f"fragment of {args.elements} f32 ({gib:.2f} GiB), {args.reps} reps, medians:")
        for name, times in (("submit", submit), ("collect", collect), ("np.copyto (memcpy)", memcpy)):
            median = statistics.median(times)
            print(f"  {name:20s} {median:8.3f} s  {gib / median:6.2f} GiB/s  ({median / statistics.median(memcpy):.1f}x memcpy)")
        session.leave()
        # Per inner step when no round is due: H is 10^9 here.
        small = client.join("echo", 0, args.elements)
        params = np.zeros(args.elements, dtype=np.float32)
        loop = DiLoCo(small, params, progress_every=1.0)
        t = time.perf_counter()
        for _ in range(args.steps):
            loop.step()
        per_step = (time.perf_counter() - t) / args.steps
        print(f"  DiLoCo.step, no round due: {per_step * 1e6:.1f} us per inner step (mean of {args.steps}; a progress report every second)")
        small.leave()
    finally:
        agent.terminate()
        agent.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
