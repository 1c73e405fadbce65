"""Results of the FedDaDiL issue: the paper's table and figures, measured on this simulator.

Runs, for every target domain of TEP (and of the digits), FedAvg source-only,
source-only with per-domain normalization, FedDANN, FedMMD, FedDaDiL (R and E)
and centralized DaDiL (R and E); then FedDaDiL on one target for local epochs
E in {1, 5, 10} to plot the DiL loss and the atom drift per round. Writes
``table.md``, ``claims.md``, ``summaries.json`` and PNG plots into ``--out``.
Each run's summary is kept in ``--out/runs/``, so an interrupted invocation
continues where it stopped.

    python -m experiments.dadil_results --out results/feddadil [--benchmarks tep,digits] [--rounds 30] [--quick]

Hyperparameters are fixed in advance (see METHODS below) and never chosen on
target accuracy; all runs use seed 0 and the local backend (the Ray backend
gives the same numbers).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
import zlib
from pathlib import Path

import numpy as np

log = logging.getLogger("dadil_results")

# (label, method, extra overrides); hyperparameters fixed a priori, never tuned on target accuracy
METHODS = [
    ("FedAvg source-only", "fedavg", []),
    ("source-only + per-domain norm.", "fedavg", ["data.normalization=per-domain"]),
    ("FedDANN", "feddann", []),
    ("FedMMD", "fedmmd", []),
    ("FedDaDiL", "feddadil", []),
    ("DaDiL (centralized)", "dadil", []),
]
BENCHMARK_SETTINGS = {
    # TEP: features (53-d), federated standardization by default; 6 modes
    "tep": {"targets": ["mode1", "mode2", "mode3", "mode4", "mode5", "mode6"], "common": [], "dictionary": ["method.batch_size=128", "method.samples_per_atom=256"]},
    # digits: raw images; FedDaDiL/DaDiL learn the dictionary on a FedAvg encoder (5 rounds)
    "digits": {"targets": ["mnistm", "usps"], "common": [], "dictionary": ["method.batch_size=128", "method.samples_per_atom=256", "method.encoder_rounds=5"]},
}


def run_one(out: Path, benchmark: str, target: str, label: str, method: str, extra: list[str], rounds: int, local_epochs: int = 1) -> dict:
    from experiments.run import run_experiment
    from fedsim.config import load_config

    slug = f"{benchmark}-{target}-{method}-{zlib.crc32(' '.join(extra).encode()):08x}-E{local_epochs}-R{rounds}"
    path = out / "runs" / f"{slug}.json"
    if path.exists():
        return json.loads(path.read_text())
    settings = BENCHMARK_SETTINGS[benchmark]
    overrides = [
        f"data.benchmark={benchmark}", f"data.target={target}", f"method.name={method}", f"run.rounds={rounds}",
        f"method.local_epochs={local_epochs}", "run.backend=local", "run.progress=false", "run.tensorboard=false",
        "run.checkpoint_every=0", f"run.eval_every={rounds}",
    ] + settings["common"] + (settings["dictionary"] if method in ("feddadil", "dadil") else []) + extra
    started = time.perf_counter()
    result = run_experiment(load_config(None, overrides))
    record = {
        "benchmark": benchmark, "target": target, "label": label, "method": method, "local_epochs": local_epochs,
        "summary": result.summary, "dil_loss": [_mean(m.get("dil_loss")) for m in result.history],
        "atom_drift": [m.get("atom_drift") for m in result.history], "seconds": time.perf_counter() - started,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    log.info("%s %s %s: target %.3f (%.0f s)", benchmark, target, label, result.summary["target_accuracy"], record["seconds"])
    return record


def _mean(values):
    return None if not values else float(np.mean(list(values.values())))


def rows_for(records: list[dict], benchmark: str, targets: list[str]) -> list[tuple[str, list]]:
    rows = []
    for label, method, _ in METHODS:
        variants = [("", "target_accuracy")] + ([(" R", "target_accuracy"), (" E", "target_accuracy_E")] if method in ("feddadil", "dadil") else [])
        for suffix, key in (variants[1:] if len(variants) > 1 else variants):
            values = []
            for target in targets:
                match = [r for r in records if r["benchmark"] == benchmark and r["target"] == target and r["label"] == label and r["local_epochs"] == 1]
                values.append(match[0]["summary"].get(key) if match else None)
            rows.append((label + suffix, values))
    return rows


def markdown_table(benchmark: str, targets: list[str], rows) -> str:
    lines = [f"### {benchmark}", "", "| method | " + " | ".join(targets) + " | mean |", "|---|" + "---|" * (len(targets) + 1)]
    for label, values in rows:
        cells = [f"{100 * v:.1f}" if v is not None else "-" for v in values]
        present = [v for v in values if v is not None]
        mean = f"{100 * np.mean(present):.1f}" if len(present) == len(values) else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(lines) + "\n"


def claims(rows_by_benchmark: dict, epoch_records: list[dict]) -> str:
    out = ["## The paper's claims, as measured here", ""]
    for benchmark, rows in rows_by_benchmark.items():
        means = {label: np.mean(v) for label, v in rows if all(x is not None for x in v)}
        fed = max(means.get("FedDaDiL R", -1), means.get("FedDaDiL E", -1))
        central = max(means.get("DaDiL (centralized) R", -1), means.get("DaDiL (centralized) E", -1))
        checks = [
            ("FedDaDiL above FedAvg source-only", fed > means.get("FedAvg source-only", 2)),
            ("FedDaDiL above FedDANN and FedMMD", fed > max(means.get("FedDANN", 2), means.get("FedMMD", 2))),
            ("federated below centralized (FedDaDiL < DaDiL)", fed < central),
        ]
        out.append(f"**{benchmark}** (mean target accuracy over targets; best of R and E):")
        for text, holds in checks:
            out.append(f"- {text}: {'holds' if holds else 'does NOT hold'} here")
        out.append("")
    if epoch_records:
        out.append("**Local epochs E** (FedDaDiL, one target):")
        by_e = {r["local_epochs"]: r for r in epoch_records}
        es = sorted(by_e)
        drift_mean = {e: np.nanmean([d for d in by_e[e]["atom_drift"] if d is not None]) for e in es}
        loss_final = {e: np.nanmean([v for v in by_e[e]["dil_loss"][-3:] if v is not None]) for e in es}
        grows = all(drift_mean[a] < drift_mean[b] for a, b in zip(es, es[1:]))
        lower = all(loss_final[a] > loss_final[b] for a, b in zip(es, es[1:]))
        shrinks = {}
        for e in es:
            drift = [d for d in by_e[e]["atom_drift"] if d is not None]
            half = max(1, len(drift) // 2)
            shrinks[e] = np.mean(drift[half:]) < np.mean(drift[:half])
        out.append(f"- atom drift grows with E ({', '.join(f'E={e}: {drift_mean[e]:.3g}' for e in es)}): {'holds' if grows else 'does NOT hold'}")
        out.append(f"- atom drift shrinks over rounds (second half below first half): " + ", ".join(f"E={e}: {'yes' if shrinks[e] else 'no'}" for e in es))
        out.append(f"- DiL loss lower for larger E (mean of the last 3 rounds: {', '.join(f'E={e}: {loss_final[e]:.3g}' for e in es)}): {'holds' if lower else 'does NOT hold'}")
    return "\n".join(out) + "\n"


def plots(out: Path, rows_by_benchmark: dict, targets_by_benchmark: dict, epoch_records: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for benchmark, rows in rows_by_benchmark.items():
        targets = targets_by_benchmark[benchmark]
        fig, ax = plt.subplots(figsize=(1.6 * len(targets) + 4, 4))
        width = 0.8 / len(rows)
        for i, (label, values) in enumerate(rows):
            ax.bar(np.arange(len(targets)) + i * width, [100 * (v or 0) for v in values], width, label=label)
        ax.set_xticks(np.arange(len(targets)) + 0.4 - width / 2, targets)
        ax.set_ylabel("target accuracy (%)")
        ax.set_title(f"{benchmark}: accuracy per target domain")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / f"accuracy-{benchmark}.png", dpi=120)
        plt.close(fig)
    if epoch_records:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for record in sorted(epoch_records, key=lambda r: r["local_epochs"]):
            rounds = np.arange(1, len(record["dil_loss"]) + 1)
            axes[0].plot(rounds, [np.nan if v is None else v for v in record["dil_loss"]], label=f"E={record['local_epochs']}")
            axes[1].plot(rounds, [np.nan if v is None else v for v in record["atom_drift"]], label=f"E={record['local_epochs']}")
        axes[0].set_title("DiL loss (mean over clients)")
        axes[1].set_title("atom drift between client versions")
        for ax in axes:
            ax.set_xlabel("round")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "dil-loss-and-drift.png", dpi=120)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/feddadil")
    parser.add_argument("--benchmarks", default="tep,digits")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--epochs-target", default="tep:mode2", help="benchmark:target of the E in {1,5,10} runs")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and targets (a smoke run, not the table)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("fedsim").setLevel(logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds = 3 if args.quick else args.rounds
    records, rows_by_benchmark, targets_by_benchmark = [], {}, {}
    for benchmark in args.benchmarks.split(","):
        targets = BENCHMARK_SETTINGS[benchmark]["targets"][: 1 if args.quick else None]
        targets_by_benchmark[benchmark] = targets
        for target in targets:
            for label, method, extra in METHODS:
                records.append(run_one(out, benchmark, target, label, method, extra, rounds))
        rows_by_benchmark[benchmark] = rows_for(records, benchmark, targets)
    bench, target = args.epochs_target.split(":")
    epoch_records = [run_one(out, bench, target, "FedDaDiL", "feddadil", [], rounds, local_epochs=e) for e in (1, 5, 10)] if bench in args.benchmarks else []
    table = f"Target accuracy (%), seed 0, {rounds} rounds, {time.strftime('%Y-%m-%d')}\n\n" + "\n".join(
        markdown_table(b, targets_by_benchmark[b], rows) for b, rows in rows_by_benchmark.items()
    )
    (out / "table.md").write_text(table)
    (out / "claims.md").write_text(claims(rows_by_benchmark, epoch_records))
    (out / "summaries.json").write_text(json.dumps(records + epoch_records, indent=1))
    plots(out, rows_by_benchmark, targets_by_benchmark, epoch_records)
    print(table)
    print((out / "claims.md").read_text())


if __name__ == "__main__":
    main()
