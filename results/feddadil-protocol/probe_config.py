"""The run the feddadil-protocol probes instrument: one local-backend trial at the protocol's dictionary settings
(n_b = 200, quiet, no checkpoints), with the probe's own method, rounds, local epochs and extra overrides."""
from fedsim.config import load_config


def probe_config(bench: str, target: str, method: str, rounds: int = 20, epochs: int = 5, eval_every=None,
                 seed=None, extra=()):
    overrides = [f"data.benchmark={bench}", f"data.target={target}", f"method.name={method}", f"run.rounds={rounds}",
                 "method.batch_size=200", f"method.local_epochs={epochs}", f"run.eval_every={eval_every or rounds}",
                 "run.backend=local", "run.progress=false", "run.tensorboard=false", "run.checkpoint_every=0"]
    if seed is not None:
        overrides.append(f"run.seed={seed}")
    return load_config(None, overrides + list(extra))
