import json, glob, sys
rows = []
for d in sorted(glob.glob('results/feddadil-short/lr-labels/lrl-*')) + ['results/feddadil-short/e5-feddadil-r12']:
    f = d + '/metrics.jsonl'
    try: lines = [json.loads(l) for l in open(f)]
    except OSError: continue
    if len(lines) < 12 or 'source_accuracy' not in lines[-1]: continue
    src = [k for k in lines[-1]['source_accuracy']]
    tid = [c for c in lines[0]['dil_loss'] if float(lines[0]['dil_loss'][c]) == min(map(float, lines[0]['dil_loss'].values()))]
    last = lines[-1]
    dl = [sum(v for c, v in l['dil_loss'].items() if c != '1') / 5 for l in lines[-3:]]  # client 1 = mode2, the target
    R, E = last['mean_source_accuracy'], last['mean_source_accuracy_E']
    print(d.split('/')[-1], 'sourcesR %.3f E %.3f mean %.3f | dil %.1f | target R %.3f E %.3f' % (R, E, (R+E)/2, sum(dl)/3, last['target_accuracy'], last['target_accuracy_E']))
