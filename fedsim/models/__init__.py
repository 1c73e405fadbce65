"""Models with an explicit encoder / head split (no forward hooks).

``build_model(model_config, input_shape, num_classes)`` picks a registered
model; ``"auto"`` chooses ``cnn`` for C x H x W inputs, ``cnn1d`` for C x L time series and ``mlp`` for vectors. Model
files are imported on demand by the registry (the detector, which needs
torchvision, only by the detection methods).

Models of images hold their convolution weights channels-last (``torch.channels_last``), a layout the convolutions,
batch norms and poolings after them keep and the CPU kernels run faster than torch's default one
(``python -m tools.benchmarks.layout`` compares the two). The two layouts compute the same sums in another order.
Weights leave a model C-ordered all the same (the methods send numpy copies of its state dict) and keep the model's
layout when loaded back.

Under record-level privacy (``privacy.unit=record``) every batch norm of the model is replaced by a group norm
(``build_model(..., group_norm=True)``, as Opacus' ``ModuleValidator.fix`` does): DP-SGD's per-example gradients
need layers that normalize each example on its own.

A model function may declare its own options (:func:`declares`): a frozen dataclass ``Options`` whose fields are
``model.<field>`` keys, checked when the config is built, the function getting the instance as ``options``; and a
:class:`ModelInputs`, what it does to the clients' inputs before any method sees them (the ResNets of
:mod:`fedsim.models.resnet` declare ``weights``, ``backbone`` and ``head``, and cache a frozen backbone's features,
:mod:`fedsim.models.features`).
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, TypeVar

import torch

from fedsim.coercion import NoOptions
from fedsim.errors import UserError
from fedsim.models.classifier import Classifier
from fedsim.models.normalization import replace_batch_norm
from fedsim.registry import MODELS

F = TypeVar("F", bound=Callable)


class ModelInputs:
    """What a model does to the clients' inputs before any method sees them; this base leaves them as they are."""

    def federation(self, config, federation):
        """In the driver, before anything runs or is written: the model's one-line checks of the setting, and the
        federation whose ``input_shape`` the models are built for."""
        return federation

    def client_data(self, config, data, device: str = "cpu"):
        """In the process hosting the client, right after its data is built: the inputs the methods train on."""
        return data


def declares(options: type = NoOptions, inputs: Optional[ModelInputs] = None) -> Callable[[F], F]:
    """A decorator declaring a model function's own options (``options``: a frozen dataclass whose fields are
    ``model.<field>`` keys; the function takes the instance as ``options``) and its :class:`ModelInputs`."""

    def decorator(factory: F) -> F:
        factory.Options = options  # type: ignore[attr-defined]
        if inputs is not None:
            factory.inputs = inputs  # type: ignore[attr-defined]
        return factory

    return decorator


def model_inputs(model_config) -> ModelInputs:
    """The :class:`ModelInputs` the configured model declares (the base one for "auto" and models without)."""
    if model_config.name == "auto":
        return ModelInputs()
    return getattr(MODELS.get(model_config.name), "inputs", None) or ModelInputs()


def build_model(model_config, input_shape: tuple[int, ...], num_classes: int, group_norm: bool = False) -> Classifier:
    """The configured model; with ``group_norm`` (``privacy.unit=record``) its batch norms are replaced by group
    norms (:func:`fedsim.models.normalization.replace_batch_norm`), as DP-SGD's per-example gradients need."""
    name = model_config.name
    if name == "auto":
        if len(input_shape) == 3:
            name = "cnn"
        elif len(input_shape) == 2:
            name = "cnn1d"
        elif len(input_shape) == 1:
            name = "mlp"
        else:
            raise UserError(
                f"no model for inputs of shape {tuple(input_shape)}: give N x D features, N x C x L time series or "
                "N x C x H x W images"
            )
    factory = MODELS.get(name)
    declared = inspect.signature(factory).parameters
    settings = {"options": model_config.options} if "options" in declared else {}
    plugin = MODELS.targets.get(name)
    try:
        model = factory(input_shape=tuple(input_shape), num_classes=num_classes, hidden=model_config.hidden, **settings)
    except Exception as exc:
        if plugin:  # the user's own code: its traceback, with a line naming the plugin
            exc.add_note(f"raised by the model plugin {name!r} ({plugin})")
        raise
    if not isinstance(model, Classifier):
        raise UserError(
            f"model {name!r} returned an object of type {type(model).__name__}, not a fedsim.models.Classifier: "
            "return Classifier(encoder, head) (fedsim.models.classifier)"
        )
    if group_norm:
        replace_batch_norm(model)
    return model.to(memory_format=torch.channels_last) if len(input_shape) == 3 else model


__all__ = ["Classifier", "ModelInputs", "build_model", "declares", "model_inputs"]
