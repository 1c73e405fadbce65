"""Magnitudes of FedOD's loss terms at the start of the round-1 distillation (seed 0), at T = 4 and T = 1.

w_b from wb_steps.py (400 steps, seed 0); w_i = 60 client steps from w_b with the run's seeds; student = mean(w_b, w_1..w_3).
Terms per teacher-averaged batch of 16 server images: L_det, sum over levels of CWD(features), CWD(cls), L2(reg)."""
import sys, time
import numpy as np, torch
torch.set_num_threads(1)
from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.models.detector import build_detector, DetectorSpec
from fedsim.seeding import derive_seed
from fedsim.methods.common.detection_training import DetectionSet, train_steps
from fedsim.methods.common.training import make_optimizer, load_numpy, model_to_numpy, weighted_average
from fedsim.methods.fedod import channel_wise_distillation
import torch.nn.functional as F
cfg = load_config("/work/main/experiments/configs/scenes-fedod.yaml")
fed = build_federation(cfg.data)
spec = DetectorSpec(num_classes=fed.num_classes, image_size=int(fed.input_shape[-1]), width=16, fpn_channels=32, head_convs=2)
wb = dict(np.load("/tmp/coord/fedod-helper/wb_old0_t1_s400.npz"))
model = build_detector(spec, seed=0)
teachers = []
t0 = time.time()
for c in fed.clients:
    if c.domain in ("server", "dusk"):
        continue
    data = load_client_data(cfg.data, fed, c.client_id)
    load_numpy(model, wb)
    opt = make_optimizer(model.parameters(), cfg.method)
    loss = train_steps(model, DetectionSet.build(data.train.x, data.train.targets), 60, 16, opt, derive_seed(0, 1, c.client_id, "fit"))
    teachers.append(model_to_numpy(model))
    print(c.domain, "fine-tune loss", round(loss, 3), round(time.time() - t0), "s", flush=True)
server = [c.client_id for c in fed.clients if c.domain == "server"][0]
sdata = load_client_data(cfg.data, fed, server)
ds = DetectionSet.build(sdata.train.x, sdata.train.targets)
student = build_detector(spec, seed=0); load_numpy(student, weighted_average([wb] + teachers, [1.0] * 4)); student.train()
tmodels = []
for w in teachers:
    m = build_detector(spec, seed=0); load_numpy(m, w); m.eval(); tmodels.append(m)
rng = np.random.default_rng(0)
rows = {T: [] for T in (4.0, 1.0)}
for b in range(4):
    idx = rng.choice(len(ds), 16, replace=False).tolist()
    images = ds.images[idx]; targets = [ds.targets[i] for i in idx]
    maps = student.maps(images)
    det = float(sum(student.loss(maps, targets).values()))
    with torch.no_grad():
        tmaps = [m.maps(images) for m in tmodels]
    for T in rows:
        feat = np.mean([float(sum(channel_wise_distillation(s, t, T) for s, t in zip(maps["features"], tm["features"]))) for tm in tmaps])
        cls = np.mean([float(sum(channel_wise_distillation(s, t, T) for s, t in zip(maps["cls_logits"], tm["cls_logits"]))) for tm in tmaps])
        reg = np.mean([float(sum(F.mse_loss(s, t) for s, t in zip(maps["bbox_regression"], tm["bbox_regression"]))) for tm in tmaps])
        rows[T].append((det, feat, cls, reg))
for T, r in rows.items():
    det, feat, cls, reg = np.mean(r, axis=0)
    print(f"T={T:g}: L_det={det:.3f} feat(sum of 3 levels)={feat:.4f} cls(sum)={cls:.4f} reg(sum)={reg:.4f}")
    print(f"   ours (0.1 feat, 1 cls, 1 reg): {0.1*feat:.4f} + {cls:.4f} + {reg:.4f};  CWD detection code (5 per FPN level, T=1 features): {5*feat:.4f}")
