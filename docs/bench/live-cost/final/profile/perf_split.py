import sys
from collections import Counter
samples=[]; cur=[]
for line in open(sys.argv[1]):
    line=line.strip()
    if not line:
        if cur: samples.append(cur); cur=[]
        continue
    parts=line.split(None,1)
    if len(parts)<2: continue
    sym,_,dso=parts[1].rpartition(' (')
    cur.append((sym, dso.rstrip(')').split('/')[-1]))
if cur: samples.append(cur)
n=len(samples); print('samples', n)
cat=Counter(); sysc=Counter(); leaf=Counter()
for s in samples:
    if 'kallsyms' in s[0][1]:
        user=next((sym for sym,d in s if 'kallsyms' not in d), '?')
        cat['kernel (system calls)']+=1; sysc[user]+=1; continue
    owner=None
    for sym,d in s:
        if 'mypyc' in d or 'native' in d: owner='compiled code and the C-API it calls'; break
        if sym=='_PyEval_EvalFrameDefault': owner='interpreted Python'; break
    cat[owner or 'other']+=1
for k,v in cat.most_common(): print(f"{v/n*100:5.1f}% {k}")
for k,v in sysc.most_common(5): print(f"   {v/n*100:5.1f}% {k}")
