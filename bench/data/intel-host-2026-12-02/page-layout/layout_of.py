import sys,struct,time
pid=int(sys.argv[1])
out=[]
for l in open(f'/proc/{pid}/maps'):
    f=l.split()
    a,b=(int(x,16) for x in f[0].split('-'))
    if b-a < 8<<20 or 'w' not in f[1] or len(f)>5 and f[5] not in ('',) and not f[5].startswith('[anon'): continue
    n=(b-a)//4096
    with open(f'/proc/{pid}/pagemap','rb') as pm:
        pm.seek(a//4096*8); d=pm.read(n*8)
    e=struct.unpack(f'{n}Q',d)
    pres=[(x&((1<<55)-1)) if x>>63 else None for x in e]
    p=[x for x in pres if x]
    if len(p)<1000: continue
    runs=1; segs=0; prev=None
    for i,x in enumerate(pres):
        if x is None: prev=None; continue
        if prev is None or x!=prev+1: runs+=1; segs+=1
        elif i%256==0: segs+=1
        prev=x
    out.append(f"{(b-a)>>20}MiB present {len(p)} run {len(p)/runs:.2f}")
print('; '.join(out))
