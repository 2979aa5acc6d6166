"""Paired accuracy: the records the partial after-run read, before (decide-prompt/1) and after (decide-prompt/2)."""
import json, collections
def load(p):
    d={}
    for l in open(p):
        r=json.loads(l); d[(r['task'], r['variant'], r['id'])]=r
    return d
a=load('docs/evidence/eval/shared-state-after-partial/records.jsonl'); b=load('docs/evidence/eval/shared-state-before/records.jsonl')
acc=collections.defaultdict(lambda:[0,0,0])
for k,r in a.items():
    if k not in b or r['status']!='ok': continue
    s=acc[(k[0],k[1])]; s[0]+=1; s[1]+= r['predicted']==r['gold']; s[2]+= b[k]['predicted']==b[k]['gold']
for k,(n,x,y) in sorted(acc.items()): print(k, n, f"after {x/n:.3f} before {y/n:.3f}")
