# temporary: register ablation tactics 96-98 (c16 config, NP = C/2, kernel _wsa<A>) then run the explore tool
import sys
from edgesdk.kernels import bitmap_linear as kbl
orig = kbl._ws_config
def cfg(n, k, m, vd, tactic, sm, smem):
    if tactic in (96, 97, 98):
        c = orig(n, k, m, vd, 91, sm, smem)
        c["name"] += "a%d" % (tactic - 95)
        return c
    return orig(n, k, m, vd, tactic, sm, smem)
kbl._ws_config = cfg
for t in (96, 97, 98):
    kbl.WS_TACTICS[t] = ("/2", "c16")
sys.path.insert(0, "tools")
import bitmap_linear_explore as e
sys.exit(e.main(sys.argv[1:]))
