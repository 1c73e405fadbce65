"""Join the trials of several ``tools.device.tep_protocol`` calls (one per run, or per seed) into one directory with
what ``fedsim reproduce`` writes for the spec: results.csv, table.md, claims.md and the plots.

    python -m tools.device.tep_join --spec SPEC --out DIR FOLDER [FOLDER ...]

Each FOLDER is a ``--out`` of ``tep_protocol``; its ``runs/<run>-seed<k>/`` folders (``summary.json``,
``metrics.jsonl``, ``config.yaml``) are the trials. A trial is matched to the spec's variant of its run, benchmark
and target; one the spec does not name, or found twice, is refused in one line. Nothing here imports Ray.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

from tools.device.tep_protocol import record


def trial_records(spec, folders: list[Path]) -> list[dict]:
    """The finished trials under ``folders`` as :func:`tools.device.tep_protocol.record` gives them."""
    from fedsim.errors import UserError

    variants = {(run, bench, target): name for name, (run, bench, target, _) in spec.trials().items()}
    records, seen = [], set()
    for folder in folders:
        runs = Path(folder) / "runs"
        if not runs.is_dir():
            raise UserError(f"{folder} holds no runs/ folder: give the --out of a tools.device.tep_protocol call")
        for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
            run, _, seed = run_dir.name.rpartition("-seed")
            summary_path = run_dir / "summary.json"
            if not summary_path.is_file():
                continue  # a trial that did not finish
            data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
            key = (run, data["benchmark"], data["target"])
            if key not in variants:
                raise UserError(
                    f"{run_dir}: run {run!r} on {key[1]} -> {key[2]} is not a trial of the spec {spec.name}"
                )
            if (key, seed) in seen:
                raise UserError(f"{run_dir}: trial {run} seed {seed} on {key[2]} found twice; give each folder once")
            seen.add((key, seed))
            history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
            config = SimpleNamespace(
                data=SimpleNamespace(benchmark=data["benchmark"], target=data["target"]),
                run=SimpleNamespace(seed=int(seed)),
            )
            point = {"spec.variant": variants[key], "run.seed": int(seed)}
            records.append(record(point, config, json.loads(summary_path.read_text()), history, "finished"))
    return records


def main(argv=None) -> int:
    from fedsim.errors import UserError
    from fedsim.experiments.reproduce import write_outputs
    from fedsim.experiments.reproduce_spec import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the spec whose directory this is (fedsim reproduce format)")
    parser.add_argument("--out", required=True, help="the directory to write")
    parser.add_argument("folders", nargs="+", help="--out folders of tools.device.tep_protocol calls")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(None, args.spec)
        records = trial_records(spec, [Path(f) for f in args.folders])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = write_outputs(spec, records, out)
    print(f"{len(records)} trials -> {', '.join(p.name for p in written)} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
