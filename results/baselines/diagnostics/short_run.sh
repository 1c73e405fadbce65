#!/bin/bash
# usage (repository root, venv active): short_run.sh NAME CONFIG [--set ...]
name=$1; cfg=$2; shift 2; mkdir -p ${OUT:-/tmp/h15-diag}
OMP_NUM_THREADS=1 nice -n 5 fedsim run --config experiments/configs/$cfg --set data.target=${TARGET:-usps} --set run.rounds=${ROUNDS:-10} --set run.eval_every=${ROUNDS:-10} --set data.max_train_per_domain=${MAXN:-1000} --backend local --out ${OUT:-/tmp/h15-diag}/$name -q "$@" > ${OUT:-/tmp/h15-diag}/$name.log 2>&1
python3 - "$name" "${OUT:-/tmp/h15-diag}" <<'PY'
import json,sys
n, out = sys.argv[1], sys.argv[2]
ms=[json.loads(l) for l in open(f'{out}/{n}/metrics.jsonl')]
last=[m for m in ms if 'target_accuracy' in m][-1]
print(f"{n:40s} target {last['target_accuracy']*100:.1f} sources", {k: round(v*100,1) for k,v in last['source_accuracy'].items()}, f"{ms[-1].get('round_seconds',0):.1f}s/round")
PY
