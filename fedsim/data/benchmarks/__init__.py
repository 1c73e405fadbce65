"""Built-in benchmarks, one file each; every module here is imported so it registers in BENCHMARKS."""
from fedsim.discovery import import_submodules

import_submodules(__name__)
