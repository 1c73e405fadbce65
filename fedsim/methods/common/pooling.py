"""Moving client data to the server on purpose, for the centralized references: uploads and the pooled arrays."""

from __future__ import annotations

import numpy as np

from fedsim.data.base import ClientData
from fedsim.messages import Reply


def gather_sources(ctx, source_ids) -> dict[str, np.ndarray]:
    """Each source client sends its training split (``upload``); concatenated in client-id order."""
    sources = sorted(source_ids)
    replies = ctx.call("upload", None, sources)
    missing = [cid for cid in sources if cid not in replies]
    if missing:
        raise RuntimeError(f"centralized: source clients {missing} did not upload their data")
    x = np.concatenate([np.asarray(replies[cid].tensors["x"]) for cid in sources])
    y = np.concatenate([np.asarray(replies[cid].tensors["y"]) for cid in sources])
    return {"x": x, "y": y}


def gather_target_inputs(ctx, target_ids) -> np.ndarray:
    """Each target client sends its unlabeled training inputs (``upload_inputs``); concatenated in client-id order."""
    replies = ctx.call("upload_inputs", None, sorted(target_ids))
    return np.concatenate([np.asarray(replies[cid].tensors["x"]) for cid in sorted(replies)])


def labeled_upload(data: ClientData) -> Reply:
    """A source client's (standardized) training inputs and labels."""
    if data.train.y is None:
        raise ValueError(f"client {data.client_id} is unlabeled (the target): it never uploads")
    tensors = {"x": np.asarray(data.train.x), "y": np.asarray(data.train.y)}
    return Reply(data.client_id, tensors, {}, num_examples=len(data.train))


def inputs_upload(data: ClientData) -> Reply:
    """A target client's unlabeled training inputs (it holds no labels)."""
    return Reply(data.client_id, {"x": np.asarray(data.train.x)}, {}, num_examples=len(data.train))
