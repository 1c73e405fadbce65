"""FADA ablation on the embedded digits: every domain as target, five methods, one table and plots.

    python -m experiments.fada_ablation                       # 10 rounds, full domains
    python -m experiments.fada_ablation --quick               # 6 rounds, 400 training images per domain
    python -m experiments.fada_ablation --rounds 8 --max-train 500 --targets usps,mnistm

Methods (each from its shipped config in ``experiments/configs``, with the
rounds, seed, backend and data size of the command line):

* ``fedavg``: FedAvg, source only (``digits-fedavg.yaml``)
* ``feddann``: FedDANN (``digits-feddann.yaml``)
* ``fada-I``: FADA model I, dynamic attention (``digits-fada-attention.yaml``)
* ``fada-II``: model II, + federated adversarial alignment (``digits-fada-adversarial.yaml``)
* ``fada-III``: model III, + representation disentanglement (``digits-fada.yaml``)
* ``fedavg-3ep``: FedAvg with 3 local epochs, a control: model II makes two labeled
  passes per round (fit, then the adversarial stage keeps the classification loss) and
  model III a third (the disentangle stage's cross-entropy on D_inv, C_i), so gains of
  II and III over I may come from that extra training rather than from alignment

Writes into ``--out`` (default ``results/fada-ablation``): ``runs/<target>/<method>/``
(each run's config.yaml, metrics.jsonl, summary.json), ``results.json`` (final and
per-round target accuracy, FADA's attention weights per round), ``table.md`` (final
target accuracy per method and target, the mean, whether I < II < III holds, the
command and the date), ``accuracy_per_round.png``, ``final_accuracy.png`` and
``attention.png`` (model III's attention weight per source and round).
"Final" is the accuracy after the last round: target labels never pick a round.
``--resume`` reuses runs whose summary.json exists.
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

CONFIGS = Path(__file__).parent / "configs"
DOMAINS = ("mnist", "usps", "mnistm", "synth")
METHODS = {  # name: (label, config, extra overrides)
    "fedavg": ("FedAvg (source only)", "digits-fedavg.yaml", []),
    "feddann": ("FedDANN", "digits-feddann.yaml", []),
    "fada-I": ("FADA I: attention", "digits-fada-attention.yaml", []),
    "fada-II": ("FADA II: + adversarial", "digits-fada-adversarial.yaml", []),
    "fada-III": ("FADA III: + disentangle", "digits-fada.yaml", []),
    "fedavg-3ep": ("FedAvg, 3 local epochs (control)", "digits-fedavg.yaml", ["method.local_epochs=3"]),
}
QUICK = {"rounds": 6, "max_train": 400}
FULL = {"rounds": 10, "max_train": None}

log = logging.getLogger("fedsim.fada_ablation")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.fada_ablation", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/fada-ablation", help="results folder (default results/fada-ablation)")
    parser.add_argument("--rounds", type=int, help=f"rounds per run (default {FULL['rounds']}, {QUICK['rounds']} with --quick)")
    parser.add_argument("--max-train", type=int, help="training images per domain (default all, 400 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and images: minutes on 2 cores")
    parser.add_argument("--targets", default=",".join(DOMAINS), help="comma-separated target domains (default all four)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {', '.join(METHODS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="local", choices=("local", "ray"), help="local (default, serial) or ray")
    parser.add_argument("--resume", action="store_true", help="keep runs that already finished (their summary.json exists)")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    args.rounds = args.rounds if args.rounds is not None else preset["rounds"]
    args.max_train = args.max_train if args.max_train is not None else preset["max_train"]
    args.targets = [t for t in args.targets.split(",") if t]
    args.methods = [m for m in args.methods.split(",") if m]
    for target in args.targets:
        if target not in DOMAINS:
            parser.error(f"unknown target {target!r}: choose from {', '.join(DOMAINS)}")
    for method in args.methods:
        if method not in METHODS:
            parser.error(f"unknown method {method!r}: choose from {', '.join(METHODS)}")
    if args.rounds < 1 or (args.max_train is not None and args.max_train < 10):
        parser.error("--rounds must be 1 or more and --max-train 10 or more")
    return args


def run_one(args: argparse.Namespace, target: str, method: str, out: Path) -> dict:
    """One run (or its finished summary with --resume) -> a record."""
    from experiments.run import run_experiment
    from fedsim.config import load_config

    run_dir = out / "runs" / target / method
    summary_path = run_dir / "summary.json"
    if args.resume and summary_path.is_file():
        history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        summary = json.loads(summary_path.read_text())
    else:
        if run_dir.exists():
            for name in ("metrics.jsonl", "summary.json", "config.yaml", "checkpoint.pkl"):
                (run_dir / name).unlink(missing_ok=True)
        overrides = [
            f"data.target={target}", f"run.rounds={args.rounds}", f"run.seed={args.seed}", f"run.backend={args.backend}",
            "run.progress=false", "run.tensorboard=false", "run.checkpoint_every=0",
        ]
        if args.max_train is not None:
            overrides.append(f"data.max_train_per_domain={args.max_train}")
        config = load_config(CONFIGS / METHODS[method][1], overrides + METHODS[method][2])
        started = time.perf_counter()
        result = run_experiment(config, run_dir)
        summary, history = result.summary, result.history
        log.info("%s -> %s: target accuracy %.3f (%.0f s)", method, target, summary["target_accuracy"], time.perf_counter() - started)
    return {
        "target": target,
        "method": method,
        "label": METHODS[method][0],
        "final_target_accuracy": summary["target_accuracy"],
        "target_accuracy": [m.get("target_accuracy") for m in history],
        "mean_source_accuracy": summary["source_accuracy"] and float(np.mean(list(summary["source_accuracy"].values()))),
        "attention": [m.get("attention") for m in history] if method.startswith("fada") else None,
        "gap_statistic": [m.get("gap_statistic") for m in history] if method.startswith("fada") else None,
        "wall_seconds": summary["wall_seconds"],
    }


def ordering(records: list[dict], targets: list[str]) -> Optional[dict]:
    """Whether final accuracy I < II < III per target and on the mean (None if a model is missing)."""
    final = {(r["target"], r["method"]): r["final_target_accuracy"] for r in records}
    models = ("fada-I", "fada-II", "fada-III")
    if not all((t, m) in final for t in targets for m in models):
        return None
    per_target = {t: final[(t, "fada-I")] < final[(t, "fada-II")] < final[(t, "fada-III")] for t in targets}
    means = [float(np.mean([final[(t, m)] for t in targets])) for m in models]
    return {"per_target": per_target, "mean": means, "mean_holds": means[0] < means[1] < means[2]}


def write_table(records: list[dict], args: argparse.Namespace, out: Path, command: str) -> str:
    final = {(r["target"], r["method"]): r["final_target_accuracy"] for r in records}
    methods = [m for m in METHODS if any(r["method"] == m for r in records)]
    lines = [
        "| method | " + " | ".join(f"-> {t}" for t in args.targets) + " | mean |",
        "|---|" + "---:|" * (len(args.targets) + 1),
    ]
    for method in methods:
        values = [final.get((t, method)) for t in args.targets]
        cells = [f"{v:.3f}" if v is not None else "n/a" for v in values]
        mean = np.mean([v for v in values if v is not None]) if all(v is not None for v in values) else None
        lines.append(f"| {METHODS[method][0]} | " + " | ".join(cells) + f" | {'n/a' if mean is None else f'{mean:.3f}'} |")
    size = "all training images" if args.max_train is None else f"{args.max_train} training images per domain"
    lines += [
        "",
        f"Final target accuracy after {args.rounds} rounds (the target's held-out test part; no round chosen by target labels), "
        f"embedded digits, {size}, seed {args.seed}, {args.backend} backend, {time.strftime('%Y-%m-%d')}.",
        f"Command: `{command}`",
    ]
    order = ordering(records, args.targets)
    if order is not None:
        held = [t for t, ok in order["per_target"].items() if ok]
        lines.append(
            f"I < II < III holds for {len(held)} of {len(args.targets)} targets ({', '.join(held) or 'none'}); on the mean "
            f"({' < '.join(f'{m:.3f}' for m in order['mean'])}) it {'holds' if order['mean_holds'] else 'does not hold'}."
        )
    means = {m: np.mean([final[(t, m)] for t in args.targets]) for m in ("fada-III", "fedavg-3ep")
             if all((t, m) in final for t in args.targets)}
    if len(means) == 2:
        lines.append(
            f"Compute-matched control: FADA III {means['fada-III']:.3f} vs FedAvg with 3 local epochs "
            f"{means['fedavg-3ep']:.3f} on the mean."
        )
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def write_plots(records: list[dict], args: argparse.Namespace, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    cols = min(2, len(args.targets))
    rows = -(-len(args.targets) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax, target in zip(axes.flat, args.targets):
        for record in (r for r in records if r["target"] == target):
            acc = [np.nan if a is None else a for a in record["target_accuracy"]]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", markersize=3, label=record["label"])
        ax.set_title(f"target {target}")
        ax.set_xlabel("round")
        ax.set_ylabel("target accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(args.targets):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "accuracy_per_round.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    methods = [m for m in METHODS if any(r["method"] == m for r in records)]
    final = {(r["target"], r["method"]): r["final_target_accuracy"] for r in records}
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(args.targets)), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [final.get((t, method)) or 0.0 for t in args.targets]
        ax.bar(np.arange(len(args.targets)) + i * width, values, width, label=METHODS[method][0])
    ax.set_xticks(np.arange(len(args.targets)) + width * (len(methods) - 1) / 2, args.targets)
    ax.set_ylabel(f"final target accuracy (round {args.rounds})")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    written.append(out / "final_accuracy.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    attention = [r for r in records if r["method"] == "fada-III" and r["attention"]]
    if attention:
        fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.5 * rows), squeeze=False)
        for ax, record in zip(axes.flat, attention):
            sources = sorted(record["attention"][0])
            for source in sources:
                ax.plot(range(1, len(record["attention"]) + 1), [a[source] for a in record["attention"]], marker="o", markersize=3, label=source)
            ax.set_title(f"FADA III attention, target {record['target']}")
            ax.set_xlabel("round")
            ax.set_ylabel("attention weight")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(attention):]:
            ax.axis("off")
        fig.tight_layout()
        written.append(out / "attention.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m experiments.fada_ablation " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    records = []
    for target in args.targets:
        for method in args.methods:
            records.append(run_one(args, target, method, out))
            (out / "results.json").write_text(json.dumps({"command": command, "records": records}, indent=2) + "\n")
    print(write_table(records, args, out, command.strip()))
    for path in write_plots(records, args, out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
