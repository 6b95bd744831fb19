"""DiLoCo against synchronous data parallelism through longhaul, over seeds.

Runs the two training rehearsals (``deploy/scenarios/train-chars-diloco.toml``
and ``train-chars-sync-dp.toml``: the same model, data, steps and batch,
two campuses 80 km apart behind the emulator) once per seed, and prints
each run's final held-out loss, the spread over seeds, the bytes the
fragment exchanges moved and their ratio, and per outer round the
exchange time the planner predicted beside what the trainers waited.
Writes the loss curves as an SVG (``--svg``) and everything as JSON
(``--json``).

    cargo build --release --bin longhaul
    PYTHONPATH=site-agent/python python3 site-agent/python/benchmarks/compare_training.py \\
        --longhaul target/release/longhaul --seeds 1 2 3 --svg curves.svg
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SCENARIOS = {
    "sync-dp": os.path.join(ROOT, "deploy/scenarios/train-chars-sync-dp.toml"),
    "diloco": os.path.join(ROOT, "deploy/scenarios/train-chars-diloco.toml"),
}


def rehearse(longhaul: str, scenario: str, seed: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "site-agent/python"))
    out = subprocess.run(
        [longhaul, "rehearse", scenario, "--seed", str(seed), "--output", "json"],
        env=env, check=True, stdout=subprocess.PIPE, timeout=3600,
    )
    return json.loads(out.stdout)


def svg(curves: Dict[str, List[List[dict]]], path: str) -> None:
    """Held-out loss against inner steps, one line per run."""
    width, height, pad = 640, 400, 50
    points = [p for runs in curves.values() for run in runs for p in run]
    xmax = max(p["step"] for p in points)
    ymin = min(p["held_out_loss"] for p in points)
    ymax = max(p["held_out_loss"] for p in points)
    x = lambda s: pad + (width - 2 * pad) * s / xmax
    y = lambda l: height - pad - (height - 2 * pad) * (l - ymin) / max(ymax - ymin, 1e-9)
    colours = {"sync-dp": "#1f77b4", "diloco": "#d62728"}
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">inner steps</text>',
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">held-out loss (nats)</text>',
        f'<text x="{pad}" y="{pad - 10}">{ymax:.2f}</text><text x="{pad}" y="{height - pad + 15}">{ymin:.2f}</text>',
        f'<text x="{width - pad}" y="{height - pad + 15}" text-anchor="end">{xmax}</text>',
    ]
    for i, (mode, runs) in enumerate(curves.items()):
        for run in runs:
            pts = " ".join(f"{x(p['step']):.1f},{y(p['held_out_loss']):.1f}" for p in run)
            lines.append(f'<polyline fill="none" stroke="{colours.get(mode, "black")}" stroke-width="1.5" points="{pts}"/>')
        lines.append(f'<text x="{width - pad - 150}" y="{pad + 16 * i}" fill="{colours.get(mode, "black")}">{mode}</text>')
    lines.append("</svg>")
    with open(path, "w") as file:
        file.write("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--longhaul", required=True, help="the longhaul binary (a release build)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--svg", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: Dict[str, List[dict]] = {mode: [] for mode in SCENARIOS}
    for seed in args.seeds:
        for mode, scenario in SCENARIOS.items():
            report = rehearse(args.longhaul, scenario, seed)
            training = report["training"]
            run = training["sites"][0]["run"]
            row = {
                "seed": seed,
                "final_held_out_loss": run["final_held_out_loss"],
                "exchange_bytes": training["exchange_bytes"],
                "wan_bytes": training["wan_bytes"],
                "same_parameters": training["same_parameters"],
                "rounds": len(run["rounds"]),
                "inner_steps": run["inner_steps"],
                "codec_bits": run["codec_bits"],
                "seconds": run["seconds"],
                "curve": run["curve"],
                "trainer_exchange_s": statistics.median(r["exchange_seconds"] for r in run["rounds"]),
                "planner_exchange_ms": statistics.median(
                    r["predicted_ms"] for r in report["rounds"]["rounds"] if r.get("predicted_ms") is not None
                ),
                "agent_exchange_ms": statistics.median(
                    r["exchange_ms"] for r in report["rounds"]["rounds"] if r.get("exchange_ms") is not None
                ),
            }
            results[mode].append(row)
            print(f"seed {seed} {mode}: held-out {row['final_held_out_loss']:.4f}, {row['rounds']} rounds, "
                  f"{row['exchange_bytes'] / 2**20:.2f} MiB exchanged, {row['seconds']:.0f} s", flush=True)
    print()
    print(f"{'mode':8s} {'H':>4s} {'bits':>4s} {'loss mean':>9s} {'spread':>7s} {'exchanged':>11s} {'per round: predicted':>21s} {'agents':>8s} {'trainer waited':>15s}")
    for mode, rows in results.items():
        losses = [r["final_held_out_loss"] for r in rows]
        print(f"{mode:8s} {rows[0]['inner_steps']:4d} {rows[0]['codec_bits']:4d} {statistics.mean(losses):9.4f} "
              f"{max(losses) - min(losses):7.4f} {statistics.mean(r['exchange_bytes'] for r in rows) / 2**20:9.2f} MiB "
              f"{statistics.median(r['planner_exchange_ms'] for r in rows):18.1f} ms {statistics.median(r['agent_exchange_ms'] for r in rows):5.0f} ms "
              f"{statistics.median(r['trainer_exchange_s'] for r in rows) * 1000:12.0f} ms")
    ratio = statistics.mean(r["exchange_bytes"] for r in results["sync-dp"]) / statistics.mean(
        r["exchange_bytes"] for r in results["diloco"]
    )
    print(f"\nDiLoCo exchanged {ratio:.0f}x fewer bytes; every run ended with the same parameters at both sites: "
          f"{all(r['same_parameters'] for rows in results.values() for r in rows)}")
    if args.svg:
        svg({mode: [r["curve"] for r in rows] for mode, rows in results.items()}, args.svg)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
