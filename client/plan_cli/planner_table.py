#!/usr/bin/env python3
"""Regenerates the schedule comparison tables of docs/planner.md.

  python3 client/plan_cli/planner_table.py [PATH/TO/dfa-plan]
"""
import json, random, subprocess, sys
P_LIST=[2,3,4,8,16,64]
BIN=sys.argv[1] if len(sys.argv) > 1 else "build/client/plan_cli/dfa-plan"
def run(P, mask, sched, speeds=None):
    cmd=[BIN,"--workers",str(P),"--seq","262144","--heads","32","--head-dim","128",f"--{mask}","--schedule",sched,"--json","--no-steps"]
    if speeds: cmd+=["--speeds",",".join(f"{s:.4f}" for s in speeds)]
    r=subprocess.run(cmd,capture_output=True,text=True)
    if r.returncode!=0: return None
    d=json.loads(r.stdout)
    mib=max(w["bytes_received"] for w in d["forward"]["workers"])/2**20
    return f'{d["compute_makespan_ratio"]:.4f} / {d["makespan_ratio"]:.4f} / {d["backward_makespan_ratio"]:.4f} / {mib:.1f}'
for mask in ["causal","full"]:
    print(f"{mask}:\n")
    print("| P | bound ring (2P-1)/P | bound distflash (P+1)/P | ring | distflash | zigzag | balanced | balanced, speeds 1,2,1,2... | balanced, random speeds in [0.5, 2] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for P in P_LIST:
        if mask=="causal":
            br=f"{(2*P-1)/P:.4f}"; bd=f"{(P+1)/P:.4f}" if P%2==0 else "n/a"
        else:
            br=bd="1.0000"
        cells=[]
        for s in ["ring","distflash","zigzag","balanced"]:
            c=run(P,mask,s)
            cells.append(c if c else "n/a (odd P)")
        alt=[1 if i%2==0 else 2 for i in range(P)]
        random.seed(P); rnd=[random.uniform(0.5,2) for _ in range(P)]
        cells.append(run(P,mask,"balanced",alt) if P>1 else "")
        cells.append(run(P,mask,"balanced",rnd))
        print(f"| {P} | {br} | {bd} | "+" | ".join(cells)+" |", flush=True)
    print()
