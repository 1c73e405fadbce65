#!/bin/bash
# preinstalled.sh VENV SITE_PACKAGES: the stand-in for a node image that already holds fedsim's pinned dependencies.
# Makes the packages in SITE_PACKAGES (a venv's site-packages of the same Python) importable from VENV through a .pth
# file, read-only, and installs node_ray.py (next to this script) as VENV/bin/ray. `pip install -c constraints.txt -e
# ~/fedsim` then finds every dependency satisfied and installs fedsim alone, from the mounted checkout.
set -euo pipefail
venv=$1
site=$2
here=$(cd "$(dirname "$0")" && pwd)
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$purelib/preinstalled.pth"
{ echo "#!$venv/bin/python"; cat "$here/node_ray.py"; } > "$venv/bin/ray"
chmod +x "$venv/bin/ray"
echo "preinstalled: $site -> $purelib; ray -> $venv/bin/ray"
