"""Differential privacy on what clients send (``docs/privacy.md``): each training reply's contribution clipped in
L2 and noised with a Gaussian, in the central mode of client-level DP-FedAvg (McMahan et al., ICLR 2018) or the
local one, and the budget spent counted with Google's dp_accounting.

* :mod:`fedsim.privacy.exchanges`: the vocabulary in which each method declares what its training exchanges send
  and how its server uses them, and the function that reads the declaration;
* :mod:`fedsim.privacy.mechanism`: the clip and the noise on one reply;
* :mod:`fedsim.privacy.accountant`: the events, the accountant and the calibration of a target epsilon;
* :mod:`fedsim.privacy.protocol`: the run's and the round's privacy, as the server applies them.

Only the exchanges' vocabulary is imported here (the config checks read it); the accountant, and dp_accounting with it,
is imported by a run that turns privacy on.
"""

from fedsim.privacy.exchanges import Exchanges, Stage, method_exchanges, one_fit

__all__ = ["Exchanges", "Stage", "method_exchanges", "one_fit"]
