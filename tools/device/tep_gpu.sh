#!/usr/bin/env bash
# The TEP protocol's target mode2 (tools/device/tep_mode2.yaml) on the lent GPU machine, in one call, without Ray.
#
# Here, once (needs the package index; the wheels go to tools/device/wheels/, ignored by git):
#     tools/device/tep_gpu.sh fetch
# Then on the GPU machine (the device tool's run, carrying the wheels; $OUT is the folder that comes back):
#     run(command="bash tools/device/tep_gpu.sh", carry=["tools/device/wheels"], timeout_s=600)
# Settings through the environment: SEEDS (0,1,2), WINDOWS (100), PRECISION (bf16), BUDGET_S (480: no trial
# starts after it), RUNS (all of the spec's), EXTRA (more arguments of tools/device/tep_protocol.py).
#
# The machine has Python 3.12, torch, numba, scipy, scikit-learn and tensorboard, and no network: the script
# installs, from the carried wheels and without their dependencies, only the packages that do not import there
# (POT, tep-studio and what it imports, dp-accounting, pyyaml, tqdm, psutil, threadpoolctl), then fedsim itself
# with --no-deps, builds the windows on every core and runs the protocol; results.csv, table.md, claims.md,
# trials.csv and the log land in $OUT.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WHEELS="$HERE/wheels"
PY="${PYTHON:-python3}"

if [ "${1:-}" = "fetch" ]; then
    # cp312 manylinux wheels of the packages the machine lacks; tep-studio has no cp312 wheel on the index, so its
    # wheel is built here from the sdist: its compiled part is a cffi module on the limited API (abi3), which a
    # Python 3.12 imports, and the wheel is tagged so.
    mkdir -p "$WHEELS"
    PIP=("$PY" -m pip download --only-binary=:all: --python-version 3.12 --no-deps -d "$WHEELS"
         --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
    "${PIP[@]}" pot==0.9.7.post1 dp-accounting==0.6.0 pyyaml tqdm psutil threadpoolctl cffi pycparser \
        pandas python-dateutil pytz tzdata six gymnasium farama-notifications cloudpickle typing-extensions
    build="$(mktemp -d)"
    "$PY" -m pip wheel --no-deps tep-studio==0.2.0 -w "$build"
    for wheel in "$build"/tep_studio-0.2.0-*.whl; do
        unzip -l "$wheel" | grep -q "abi3.so" || { echo "tep-studio's wheel has no abi3 module: build it on 3.12"; exit 2; }
        cp "$wheel" "$WHEELS/tep_studio-0.2.0-cp311-abi3-linux_x86_64.whl"
    done
    rm -rf "$build"
    du -sh "$WHEELS"
    exit 0
fi

OUT="${OUT:-$ROOT/tep-gpu-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
cd "$ROOT"
started=$(date +%s)
declare -A module=(
    [pot]=ot [tep-studio]=tep_studio [dp-accounting]=dp_accounting [pyyaml]=yaml [tqdm]=tqdm [psutil]=psutil
    [threadpoolctl]=threadpoolctl [cffi]=_cffi_backend [pycparser]=pycparser [pandas]=pandas
    [python-dateutil]=dateutil [pytz]=pytz [tzdata]=tzdata [six]=six [gymnasium]=gymnasium
    [farama-notifications]=farama_notifications [cloudpickle]=cloudpickle [typing-extensions]=typing_extensions
)
missing=()
for name in "${!module[@]}"; do
    "$PY" -c "import ${module[$name]}" 2>/dev/null || missing+=("$name")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing from $WHEELS: ${missing[*]}"
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps "${missing[@]}"
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" 2>/dev/null \
    || export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # no setuptools there: the source tree itself
"$PY" -c "import fedsim, sys; assert 'ray' not in sys.modules; print('fedsim from', fedsim.__file__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
echo "setup: $(( $(date +%s) - started )) s"

"$PY" -m tools.device.tep_protocol --out "$OUT" --seeds "${SEEDS:-0,1,2}" --windows "${WINDOWS:-100}" \
    --precision "${PRECISION:-bf16}" --workers "$(nproc)" --budget-s "${BUDGET_S:-480}" \
    ${RUNS:+--runs "$RUNS"} ${EXTRA:-}
echo "total: $(( $(date +%s) - started )) s"
