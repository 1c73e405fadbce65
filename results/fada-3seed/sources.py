"""Each source domain's accuracy against FedAvg with the same labeled training (issue #13, deliverable 4):
per benchmark, target and source domain, the mean over seeds of (row - its compute-matched FedAvg), from the
trials' last-round metrics. Run: python results/fada-3seed/sources.py runs/fada-3seed"""
import collections
import glob
import json
import statistics as st
import sys

import yaml

MATCHED = {"I": "fedavg1", "II": "fedavg2", "III": "fedavg3", "III-u": "fedavg3", "fedmmd1": "fedavg1", "feddann1": "fedavg1"}


def row_name(method: dict) -> str:
    if method["name"] == "fada":
        if not method.get("disentangle"):
            return "I" if not method.get("adversarial") else "II"
        return "III" if method.get("attention") else "III-u"
    return f"{method['name']}{method.get('local_epochs')}"


def main(root: str) -> None:
    accuracy = collections.defaultdict(dict)  # (benchmark, row) -> {(target, seed): {source: accuracy}}
    for summary in glob.glob(f"{root}/runs/*/summary.json"):
        config = yaml.safe_load(open(summary.replace("summary.json", "config.yaml")))
        last = [json.loads(line) for line in open(summary.replace("summary.json", "metrics.jsonl"))][-1]
        accuracy[(config["data"]["benchmark"], row_name(config["method"]))][(config["data"]["target"], config["run"]["seed"])] = last["source_accuracy"]
    for bench in sorted({b for b, _ in accuracy}):
        for row, control in MATCHED.items():
            cells, reference = accuracy[(bench, row)], accuracy[(bench, control)]
            per_domain = collections.defaultdict(list)  # (target, source) -> differences over seeds
            for (target, seed), sources in cells.items():
                for source, value in sources.items():
                    if (target, seed) in reference:
                        per_domain[(target, source)].append(value - reference[(target, seed)][source])
            if not per_domain:
                continue
            means = {key: st.mean(values) for key, values in per_domain.items()}
            worst = min(means, key=means.get)
            below = sum(value < -0.05 for value in means.values())
            print(f"{bench:6s} {row:8s} vs {control}: mean {100 * st.mean(means.values()):+5.1f} pts over {len(means)} (target, source) pairs; "
                  f"{below} more than 5 pts below; worst {worst[1]} (target {worst[0]}) {100 * means[worst]:+5.1f} pts "
                  f"(seeds per pair: {min(len(v) for v in per_domain.values())})")


if __name__ == "__main__":
    main(sys.argv[1])
