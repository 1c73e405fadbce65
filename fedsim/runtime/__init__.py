"""Round loop, executors and callbacks (no Ray here: see ``actors/`` for the Ray backend)."""

from fedsim.runtime.executor import Executor, LocalExecutor
from fedsim.runtime.server import Server
from fedsim.runtime.simulator import Simulator

__all__ = ["Executor", "LocalExecutor", "Server", "Simulator"]
