"""An encoder followed by a linear head: the split methods such as FedRep, FADA and FedBN rely on."""

from __future__ import annotations

from torch import nn


class Classifier(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, x):
        return self.head(self.encoder(x))

    def features(self, x):
        return self.encoder(x)
