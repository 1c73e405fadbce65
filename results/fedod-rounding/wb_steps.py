"""Train the base model for K steps with whichever fedsim is on PYTHONPATH; print a hash of the weights and the loss."""
import hashlib, sys, time
import numpy as np, torch
from fedsim.config import load_config
from fedsim.data.scenario import build_federation, load_client_data
from fedsim.models.detector import build_detector, DetectorSpec
from fedsim.seeding import derive_seed
steps = int(sys.argv[1]); threads = int(sys.argv[2])
torch.set_num_threads(threads)
import os
if os.environ.get("NO_MKLDNN"):
    torch.backends.mkldnn.enabled = False  # other convolution kernels: the same arithmetic, rounded in another order
cfg = load_config("/work/main/experiments/configs/scenes-baseline1.yaml")
fed = build_federation(cfg.data)
server = [c.client_id for c in fed.clients if c.domain == "server"][0]
data = load_client_data(cfg.data, fed, server)
try:
    from fedsim.methods.common.detection_training import DetectionSet, train_steps
    from fedsim.methods.common.training import make_optimizer
    pairs = data.train.targets
    old = False
except ImportError:
    from fedsim.methods._detection_common import DetectionSet, train_steps, make_optimizer
    from fedsim.data.detection import client_targets
    pairs = client_targets(cfg.data, data, "train")
    old = True
ds = DetectionSet.build(data.train.x, pairs)
h = hashlib.sha256(ds.images.numpy().tobytes()).hexdigest()[:12]
m = cfg.method
spec = DetectorSpec(num_classes=fed.num_classes, image_size=int(fed.input_shape[-1]), width=16, fpn_channels=32, head_convs=2)
model = build_detector(spec, seed=derive_seed(cfg.run.seed, "model-init"))
w0 = hashlib.sha256(b"".join(v.detach().numpy().tobytes() for v in model.state_dict().values())).hexdigest()[:12]
opt = make_optimizer(model, m) if old else make_optimizer(model.parameters(), m)
t = time.time()
loss = train_steps(model, ds, steps, m.batch_size, opt, derive_seed(cfg.run.seed, "base"), flip=True, grad_clip=10.0)
w = hashlib.sha256(b"".join(v.detach().numpy().tobytes() for v in model.state_dict().values())).hexdigest()[:12]
print(f"mkldnn={torch.backends.mkldnn.enabled} old={old} threads={threads} steps={steps} data={h} n={len(ds)} init={w0} final={w} loss={loss:.6f} lr={m.lr} {time.time()-t:.1f}s", flush=True)
if len(sys.argv) > 3 and sys.argv[3] == "eval":
    sys.path.insert(0, "/work/main")  # the current evaluation code for both trainings
    from fedsim.methods.common.detection_eval import detect_all
    from fedsim.detection.metrics import coco_map
    dets = detect_all(model, data.test.x, 50)
    gt = data.test.targets if hasattr(data.test, "targets") and data.test.targets is not None else client_targets(cfg.data, data, "test")
    r = coco_map(gt, dets, fed.num_classes)
    print(f"A_s of w_b: mAP={r['mAP']:.4f} AP50={r['AP50']:.4f}", flush=True)
    np.savez(f"/tmp/coord/fedod-helper/wb_old{int(old)}_t{threads}_s{steps}{os.environ.get('NO_MKLDNN', '')}.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})
