"""The overhead benchmark's tables: times and memory of each way against the floor, and every process of a
Ray way."""

from __future__ import annotations

from tools.benchmarks.measure import machine

#: way name -> its label in the tables
WAYS = (
    ("floor", "floor: plain serial torch loop"),
    ("local", "fedsim local backend"),
    ("ray", "fedsim Ray backend (2 actors)"),
    ("reuse", "fedsim Ray, reused cluster"),
)


def print_processes(label: str, r: dict) -> None:
    mib = 2**20
    print(
        f"\n{label}: every process at the last round (MiB; 'started' = s after the driver started, "
        f"negative: before it; load average {r['load']:.2f})"
    )
    print(f"{'process':34s} {'started':>8s} {'CPU s':>6s} {'USS':>7s} {'PSS':>7s} {'RSS':>7s}")
    for row in r["table"]:
        print(
            f"{row['role']:34s} {row['started_s']:8.2f} {row['cpu_s']:6.2f} "
            f"{row['uss'] / mib:7.1f} {row['pss'] / mib:7.1f} {row['rss'] / mib:7.1f}"
        )
    total = {k: sum(x[k] for x in r["table"]) / mib for k in ("uss", "pss", "rss")}
    print(
        f"{'total, ' + str(len(r['table'])) + ' processes':34s} {'':>8s} {r['cpu_s']:6.2f} "
        f"{total['uss']:7.1f} {total['pss']:7.1f} {total['rss']:7.1f}"
    )
    marks = ", ".join(f"{name} {value:.2f}" for name, value in r["marks"].items())
    print(
        f"driver timeline (s after start): imports {r['imported']:.2f}, {marks}, "
        f"last round {r['rounds_done']:.2f}, exit {r['whole_s']:.2f}"
    )


def report(rows: dict, cluster_start: float) -> None:
    floor_rounds, floor_whole = rows["floor"]["rounds_s"], rows["floor"]["whole_s"]
    print(f"fedavg-lenet-10 overhead benchmark, {machine()}")
    print(
        "each way runs in a fresh process; 'whole' is that process from start to exit "
        "(imports, data, Ray start and stop)"
    )
    print(
        f"{'way':32s} {'rounds s':>9s} {'rounds/floor':>13s} {'whole s':>8s} {'whole/floor':>12s} "
        f"{'peak RSS GiB':>13s} {'PSS GiB':>8s} {'procs':>6s} {'usps acc':>9s}"
    )
    for way, label in WAYS:
        if way in rows:
            r = rows[way]
            print(
                f"{label:32s} {r['rounds_s']:9.2f} {r['rounds_s'] / floor_rounds:13.2f} "
                f"{r['whole_s']:8.2f} {r['whole_s'] / floor_whole:12.2f} "
                f"{r['rss'] / 2**30:13.2f} {r['pss'] / 2**30:8.2f} {r['processes']:6d} {r['accuracy']:9.4f}"
            )
    print(
        "CPU seconds of the whole tree and load average (1 min) before each way: "
        + "; ".join(f"{way} {r['cpu_s']:.1f} s (load {r['load']:.2f})" for way, r in rows.items())
    )
    print(f"floor accuracies: {rows['floor']['detail']['accuracy']}")
    print(f"accuracies agree: {len({round(r['accuracy'], 6) for r in rows.values()}) == 1}")
    if "ray" in rows:
        r = rows["ray"]
        print(
            f"Ray backend: cluster start-up {r['marks']['connected'] - r['marks']['connecting']:.2f} s, run_experiment "
            f"{r['marks']['closed'] - r['imported']:.2f} s (of which rounds {r['rounds_s']:.2f} s), "
            f"shutdown {r['marks']['closed'] - r['marks']['closing']:.2f} s"
        )
        print(
            "RSS by process at the last round (MiB): "
            + ", ".join(f"{name} {rss / 2**20:.0f}" for name, rss in r["breakdown"])
        )
        print_processes("Ray backend, its own cluster", r)
    if "reuse" in rows:
        print_processes(
            f"Ray backend joining a running cluster ('ray start --head' took {cluster_start:.2f} s, once for a series)",
            rows["reuse"],
        )
