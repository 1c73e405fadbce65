"""FedOD results table on the embedded scenes, and a picture of detections.

    python -m experiments.fedod_results --out runs/fedod-results [--seed 0] [--set method.client_iters=40 ...]

Runs, on the local backend (the Ray backend gives identical numbers for a seed; a test
checks it), the shipped configs ``experiments/configs/scenes-*.yaml``:

1. Baseline 1 (``scenes-baseline1.yaml``): trains the base model w_b on the server's data
   and scores it; w_b is saved to ``<out>/wb.npz``;
2. Baseline 2, FedAvg, FedBN, FedRep and FedOD, each starting from that same w_b
   (``method.weights=<out>/wb.npz``, ``method.base_iters=0``: the base stage is
   deterministic, so this equals retraining it, only faster).

It writes ``<out>/results.md`` (the table, the paper's three claims as measured),
``<out>/results.json``, one run directory per row, and ``<out>/detections.png``: one
farm test image (farm holds the class the server never sees) with the ground truth
and the detections of w_b, w_g and the WBF ensemble of w_g and w_i. The picture needs
the farm client's personal w_i, which never leaves its client: the script reads it
from the client's private state in the local executor after the run (an inspection
by the simulation's owner, not a message of the protocol).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.config import load_config

log = logging.getLogger("fedsim.fedod_results")
CONFIGS = Path(__file__).parent / "configs"

# (row label, run name, config file, family)
ROWS = [
    ("Baseline 1: w_b alone", "baseline1", "scenes-baseline1.yaml", "wb"),
    ("Baseline 2: w_b + client fine-tune (WBF)", "baseline2", "scenes-baseline2.yaml", "ens_wbf"),
    ("FedAvg", "fedavg", "scenes-fedavg.yaml", "global"),
    ("FedBN (personal)", "fedbn", "scenes-fedbn.yaml", "personal"),
    ("FedRep (personal)", "fedrep", "scenes-fedrep.yaml", "personal"),
    ("FedOD w_g", "fedod", "scenes-fedod.yaml", "wg"),
    ("FedOD w_i", "fedod", "scenes-fedod.yaml", "wi"),
    ("FedOD ensemble, WBF", "fedod", "scenes-fedod.yaml", "ens_wbf"),
    ("FedOD ensemble, NMS", "fedod", "scenes-fedod.yaml", "ens_nms"),
    ("FedOD ensemble, soft-NMS", "fedod", "scenes-fedod.yaml", "ens_soft_nms"),
    ("FedOD ensemble, NMW", "fedod", "scenes-fedod.yaml", "ens_nmw"),
]
KEYS = ("A_s", "A_p", "A_u", "A_com")


def run_local(config, out_dir: Path):
    """One simulation on the local backend; returns (summary, history, server, executor)."""
    from fedsim.data.scenario import build_federation
    from fedsim.runtime import LocalExecutor, Server, Simulator

    federation = build_federation(config.data)
    executor = LocalExecutor(config, federation)
    server = Server(config, federation, executor)
    simulator = Simulator(config, server, out_dir)
    summary = simulator.run()
    return summary, simulator.history, server, executor


def table(results: dict, alpha: float) -> str:
    lines = [
        f"| predictor | A_s mAP | A_p mAP | A_u mAP | A_com({alpha:g}) mAP | A_s AP50 | A_p AP50 | A_u AP50 | A_com AP50 | target (dusk) mAP |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, run, _, family in ROWS:
        entry = results[run]["final_detection"][family]
        cells = [f"{entry[k]:.3f}" for k in KEYS] + [f"{entry['AP50' + k[1:]]:.3f}" for k in KEYS]
        cells.append(f"{entry['target']:.3f}" if "target" in entry else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_domain(results: dict, federation) -> str:
    """A_p of each row split by client domain (mAP of M_i on its own test set)."""
    domains = {str(c.client_id): c.domain for c in federation.clients}
    names = sorted({domains[cid] for cid in results["fedod"]["final_detection"]["wg"]["clients"]}, key=list(domains.values()).index)
    lines = ["| predictor | " + " | ".join(f"p ({n})" for n in names) + " | s (server) |", "|---|" + "---:|" * (len(names) + 1)]
    for label, run, _, family in ROWS:
        clients = results[run]["final_detection"][family]["clients"]
        by_domain = {domains[cid]: entry for cid, entry in clients.items()}
        s = np.mean([e["s"] for e in clients.values()])
        lines.append(f"| {label} | " + " | ".join(f"{by_domain[n]['p']:.3f}" for n in names) + f" | {s:.3f} |")
    return "\n".join(lines)


def claims(results: dict) -> list[str]:
    fedod = results["fedod"]["final_detection"]
    ens, wg, wi, wb = (fedod[k] for k in ("ens_wbf", "wg", "wi", "wb"))
    out = []
    ok = ens["A_com"] > max(wg["A_com"], wi["A_com"])
    out.append(f"- ensemble (WBF) A_com above either model alone: **{'yes' if ok else 'no'}** "
               f"(ensemble {ens['A_com']:.3f}, w_g {wg['A_com']:.3f}, w_i {wi['A_com']:.3f})")
    best = max(("ens_wbf", "ens_nms", "ens_soft_nms", "ens_nmw"), key=lambda k: fedod[k]["A_com"])
    out.append(f"  (best fusion by A_com: {best[4:]}, {fedod[best]['A_com']:.3f})")
    ok = wg["A_u"] > wb["A_u"]
    out.append(f"- w_g's A_u above w_b's: **{'yes' if ok else 'no'}** (w_g {wg['A_u']:.3f}, w_b {wb['A_u']:.3f}; "
               f"A_s {wg['A_s']:.3f} vs {wb['A_s']:.3f}, A_p {wg['A_p']:.3f} vs {wb['A_p']:.3f})")
    nms = fedod["ens_nms"]
    ok = ens["A_com"] >= nms["A_com"]
    out.append(f"- WBF at or above NMS: **{'yes' if ok else 'no'}** (A_com {ens['A_com']:.3f} vs {nms['A_com']:.3f}; "
               f"A_u {ens['A_u']:.3f} vs {nms['A_u']:.3f}; AP50_com {ens['AP50_com']:.3f} vs {nms['AP50_com']:.3f})")
    return out


FUSION_VARIANTS = [
    ("WBF, fused score = mean (default)", {}),
    ("WBF, fused score = max", {"fusion_conf": "max"}),
    ("WBF, absent-model-aware mean", {"fusion_conf": "absent_model_aware_avg"}),
    ("WBF, box-and-model mean", {"fusion_conf": "box_and_model_avg"}),
    ("WBF and NMS, weights (w_g, w_i) = (1, 2)", {"fusion_weights": (1.0, 2.0)}),
]


def reevaluate(config, server, executor, **changes) -> dict:
    """The last evaluation again with other fusion parameters, on the same models (private states untouched)."""
    import dataclasses

    from fedsim.registry import METHODS

    params = dataclasses.replace(config.method.params, **changes)
    changed = dataclasses.replace(config, method=dataclasses.replace(config.method, params=params))
    method = METHODS.get(changed.method.name)(changed, server.federation)
    previous = executor.host.method
    executor.host.method = method
    try:
        rnd = config.run.rounds
        return method.summarize_evaluation(rnd, executor.run(method.configure_evaluate(rnd, server.state)))["final_detection"]
    finally:
        executor.host.method = previous


def fusion_table(config, server, executor) -> str:
    lines = ["| fusion setting | WBF A_com | WBF A_u | WBF AP50_com | NMS A_com | NMS A_u |", "|---|---:|---:|---:|---:|---:|"]
    for label, changes in FUSION_VARIANTS:
        final = reevaluate(config, server, executor, **changes)
        wbf, nms = final["ens_wbf"], final["ens_nms"]
        lines.append(f"| {label} | {wbf['A_com']:.3f} | {wbf['A_u']:.3f} | {wbf['AP50_com']:.3f} | {nms['A_com']:.3f} | {nms['A_u']:.3f} |")
    return "\n".join(lines)


def picture(config, server, executor, weights_b: dict, path: Path, domain: str = "farm", min_score: float = 0.3) -> Path:
    """Ground truth and the detections of w_b, w_g and the WBF ensemble (w_g, w_i) on one client test image."""
    from PIL import Image, ImageDraw

    from fedsim.data.detection import client_targets
    from fedsim.data.scenario import get_domain, load_client_data
    from fedsim.methods._detection_common import detect_all
    from fedsim.methods.common.training import load_numpy

    method = server.method
    cid = next(c for c in method.client_ids if server.federation.info(c).domain == domain)
    data = load_client_data(config.data, server.federation, cid)
    image = data.test.x[:1]
    truth_boxes, truth_labels = client_targets(config.data, data, "test")[0]
    model = method.new_model()
    dets = {}
    for name, weights in (("w_b", weights_b), ("w_g", server.state["weights"]), ("w_i", executor.host.private_state(cid)["own"]["personal"])):
        load_numpy(model, weights)
        dets[name] = detect_all(model, image, 1)[0]
    fused = method.fuse_image("wbf", [dets["w_g"], dets["w_i"]], image.shape[-2:])
    panels = [("ground truth", (truth_boxes, np.ones(len(truth_boxes)), truth_labels)), ("w_b", dets["w_b"]), ("w_g", dets["w_g"]), ("ensemble (WBF of w_g, w_i)", fused)]
    names = get_domain(config.data, domain).class_names
    colours = [(255, 60, 60), (255, 210, 0), (0, 220, 255), (255, 0, 255)]
    scale = 3
    size = image.shape[-1] * scale
    canvas = Image.new("RGB", (len(panels) * (size + 8), size + 22), (255, 255, 255))
    for i, (title, (boxes, scores, labels)) in enumerate(panels):
        tile = Image.fromarray((image[0].transpose(1, 2, 0) * 255).astype(np.uint8)).resize((size, size), Image.NEAREST)
        draw = ImageDraw.Draw(tile)
        for box, score, label in zip(boxes, scores, labels):
            if score < min_score:
                continue
            draw.rectangle([float(v) * scale for v in box], outline=colours[int(label) % 4], width=2)
            draw.text((float(box[0]) * scale + 2, float(box[1]) * scale + 1), f"{names[int(label)]} {score:.2f}" if title != "ground truth" else names[int(label)], fill=colours[int(label) % 4])
        canvas.paste(tile, (i * (size + 8), 20))
        ImageDraw.Draw(canvas).text((i * (size + 8) + 2, 4), title, fill=(0, 0, 0))
    canvas.save(path)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/fedod-results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override for every run (e.g. data.variant=tiny)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [f"run.seed={args.seed}", "run.backend=local", "run.progress=false", "run.tensorboard=false", *args.set]
    results, timings = {}, {}
    wb_path = out / "wb.npz"
    started = time.perf_counter()
    fedod_handles = None
    for _, run, config_file, _ in ROWS:
        if run in results:
            continue
        extra = [] if run == "baseline1" else [f"method.weights={wb_path}", "method.base_iters=0"]
        config = load_config(CONFIGS / config_file, common + extra)
        run_dir = out / run
        if run_dir.exists():
            for stale in ("summary.json", "metrics.jsonl"):
                (run_dir / stale).unlink(missing_ok=True)
        t0 = time.perf_counter()
        summary, history, server, executor = run_local(config, run_dir)
        timings[run] = round(time.perf_counter() - t0, 1)
        log.info("%s done in %.0f s", run, timings[run])
        results[run] = summary
        if run == "baseline1":
            np.savez(wb_path, **server.state["base"])
        if run == "fedod":
            fedod_handles = (config, server, executor)
    alpha = results["fedod"]["final_alpha"]
    config, server, executor = fedod_handles
    with np.load(wb_path) as npz:
        weights_b = {k: npz[k] for k in npz.files}
    png = picture(config, server, executor, weights_b, out / "detections.png")
    fusion = fusion_table(config, server, executor)
    text = [
        f"FedOD on the embedded scenes (seed {args.seed}; overrides: {' '.join(args.set) or 'none'}). "
        f"mAP = COCO AP@[.5:.95], AP50 = AP@.5; A_s, A_p, A_u averaged over the clients (night, fog, farm); "
        f"A_com = {alpha:g} A_s + {1 - alpha:g} A_p.",
        "",
        table(results, alpha),
        "",
        "A_p by client domain and s (M_i on the server's test set), mAP:",
        "",
        per_domain(results, server.federation),
        "",
        "Fusion settings, same FedOD models (w_g, w_i) re-evaluated:",
        "",
        fusion,
        "",
        "The paper's claims, as measured here:",
        "",
        *claims(results),
        "",
        f"Run times (s, local backend, this machine): {json.dumps(timings)}; total {time.perf_counter() - started:.0f} s.",
        f"Picture: {png.name} (farm test image; boxes with score >= 0.3).",
    ]
    (out / "results.md").write_text("\n".join(text) + "\n")
    (out / "results.json").write_text(json.dumps({run: s["final_detection"] for run, s in results.items()}, indent=1, sort_keys=True) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
