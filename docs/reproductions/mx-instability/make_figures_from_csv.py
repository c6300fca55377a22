"""Draw this directory's figures from the CSVs in data/ (the two incomplete device calls of
2026-11-21), with the plotting code of scripts/reproduce-mx-instability (scripts/repro/svg.py).
A complete run of the script draws the same figures itself (OUT_DIR/plots/canon_*.svg) from its
own run directories.
  python3 docs/reproductions/mx-instability/make_figures_from_csv.py   (from the repository root)
"""
import csv, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
from repro.runs import ROLES
from repro.svg import COLORS, svg_figure
# data/probe, data/series: call 1 (fp32 and bf16 ran furthest there); data/window: call 2 (the
# per-step window around the final criterion's blow-up steps). The MX and complete bf16 CSVs of
# the two calls are identical.
R1 = R2 = os.path.join(HERE, "data")
OUT = HERE
SEEDS = [1337, 1, 2, 3, 4, 5]
B = {('mxfp8_e4m3', 1337): 7229, ('mxfp8_e4m3', 5): 8474, ('fp32', 4): '7151-7157', ('bf16', 3): '7691-7696'}
def rd(p): return list(csv.DictReader(open(p)))
def fl(v): return float(v) if v not in ('', None) else None
def series(prec, seed, n=5):
    r = rd(f'{R1}/series/canon-{prec}-s{seed}.csv')
    xs, ys = [], []
    for i in range(0, len(r), n):
        w = r[i:i + n]
        xs.append(int(w[-1]['step'])); ys.append(sum(float(x['mean']) for x in w) / len(w))
    return xs, ys
def probe(prec, seed): return rd(f'{R1}/probe/canon-{prec}-s{seed}.csv')
def pser(rows, key, label, color, dash=None, roll=1):
    xs = [int(p['step']) for p in rows]; ys = [fl(p.get(key)) for p in rows]
    if roll > 1:
        ys2 = []
        for i in range(len(ys)):
            w = [y for y in ys[max(0, i - roll + 1):i + 1] if y is not None]
            ys2.append(sum(w) / len(w) if w else None)
        ys = ys2
    return dict(label=label, x=xs, y=ys, color=color, dash=dash)

# 1. every baseline's loss
panels = []
for prec in ('mxfp8_e4m3', 'bf16', 'fp32'):
    ser = []
    for i, sd in enumerate(SEEDS):
        xs, ys = series(prec, sd)
        b = B.get((prec, sd))
        ser.append(dict(label=f'seed {sd}' + (f' (B {b})' if b else '') + ('' if xs[-1] == 9000 else f' [cut {xs[-1]}]'), x=xs, y=ys, color=COLORS[i], width=1.1))
    panels.append(dict(ylabel=f'{prec}: loss (50-step mean), log', log=True, series=ser))
svg_figure(f'{OUT}/canon_loss_all_seeds.svg', panels, (0, 9000), 'Canonical proxy (L4 d512, batch 2048, Adam 6e-4): every baseline; fp32 and bf16 runs cut by the time limit', panel_h=230)

# 2-3. per diverged MX seed
for sd, b, zoom in ((1337, 7229, (5700, 7700)), (5, 8474, (7000, 9000))):
    c = (b - 400) // 100 * 100
    vl = [(b, f'blow-up {b}', '#d62728'), (c, f'C {c}', '#555')]
    mx, bf, fp = probe('mxfp8_e4m3', sd), probe('bf16', sd), probe('fp32', sd)
    def s10(prec, label, color, dash=None):
        r = rd(f'{R1}/series/canon-{prec}-s{sd}.csv')
        return dict(label=label, x=[int(x['step']) for x in r], y=[float(x['mean']) for x in r], color=color, dash=dash)
    panels = [
        dict(ylabel='loss (10-step mean), log', log=True, series=[s10('mxfp8_e4m3', 'mxfp8_e4m3', '#d62728'), s10('bf16', 'bf16', '#1f77b4'), s10('fp32', 'fp32', '#000', '4,3')], vlines=vl),
        dict(ylabel='probe cosine(g_q, g)', series=[pser(mx, 'cosine', 'MX', '#d62728'), pser(bf, 'cosine', 'bf16', '#1f77b4')], vlines=vl),
        dict(ylabel='probe zeta = <g_q - g, g>/|g|^2', series=[pser(mx, 'zeta', 'MX overall', '#d62728')] + [pser(mx, f'L{i}_zeta', f'MX block {i}', COLORS[i + 2], '3,2') for i in range(4)] + [pser(bf, 'zeta', 'bf16 overall', '#1f77b4')], vlines=vl),
        dict(ylabel='probe rel_error |g_q - g|/|g|', series=[pser(mx, 'rel_error', 'MX', '#d62728'), pser(bf, 'rel_error', 'bf16', '#1f77b4')], vlines=vl),
        dict(ylabel='MX saturated (clipped) fraction, mean over the 8 linears', series=[pser(mx, f'sat_{ro}', ro, COLORS[i]) for i, ro in enumerate(ROLES)] + [pser(mx, 'sat_max', 'max over linears and roles', '#000', '4,3')], vlines=vl),
        dict(ylabel='LN gamma mean per block', series=[pser(mx, f'gamma{i}_mean', f'MX block {i}', COLORS[i]) for i in range(4)] + [pser(fp, f'gamma{i}_mean', f'fp32 block {i}', COLORS[i], '4,3') for i in range(4)], vlines=vl),
    ]
    cuts = [f'{p} cut at {int(rd(f"{R1}/series/canon-{p}-s{sd}.csv")[-1]["step"])}' for p in ('bf16', 'fp32') if int(rd(f"{R1}/series/canon-{p}-s{sd}.csv")[-1]["step"]) < 9000]
    t = f'Seed {sd}: mxfp8_e4m3 vs bf16 vs fp32 (probe every 50 steps; ' + ', '.join(cuts) + ')'
    svg_figure(f'{OUT}/canon_seed{sd}_probe.svg', panels, (0, 9000), t)
    svg_figure(f'{OUT}/canon_seed{sd}_probe_zoom.svg', panels, zoom, t + f', steps {zoom[0]}-{zoom[1]}')

# 4. probe across all MX seeds (rolling mean of 5 probes = 250 steps)
vl = [(7229, 'B 1337', '#d62728'), (8474, 'B 5', '#1f77b4')]
P = {sd: probe('mxfp8_e4m3', sd) for sd in SEEDS}
cols = {1337: '#d62728', 5: '#1f77b4', 1: '#2ca02c', 2: '#ff7f0e', 3: '#9467bd', 4: '#8c564b'}
def allp(key, roll=5):
    return [pser(P[sd], key, f'MX seed {sd}' + (' (diverges)' if sd in (1337, 5) else ''), cols[sd], None if sd in (1337, 5) else '3,2', roll) for sd in SEEDS]
bfp = probe('bf16', 1337)
panels = [
    dict(ylabel='probe cosine, mean of the last 5 probes (250 steps)', series=allp('cosine') + [pser(bfp, 'cosine', 'bf16 seed 1337', '#000', '1,2', 5)], vlines=vl),
    dict(ylabel='probe zeta overall, mean of the last 5 probes', series=allp('zeta') + [pser(bfp, 'zeta', 'bf16 seed 1337', '#000', '1,2', 5)], vlines=vl),
    dict(ylabel='probe zeta of block 3 (last), mean of the last 5 probes', series=allp('L3_zeta'), vlines=vl),
    dict(ylabel='saturated fraction, max over linears and roles (every 50 steps)', series=allp('sat_max', 1), vlines=vl),
    dict(ylabel='LN gamma mean, block 0', series=allp('gamma0_mean', 1) + [pser(probe('fp32', 1337), 'gamma0_mean', 'fp32 seed 1337', '#000', '1,2')], vlines=vl),
]
svg_figure(f'{OUT}/canon_probe_all_seeds.svg', panels, (0, 9000), 'The probe on all six MX seeds: the diverging ones (solid) do not stand apart before their blow-up')

# 5. onset, every step, x = step - B
panels = []
ser_l, ser_g, ser_s = [], [], []
for sd, b, col in ((1337, 7229, '#d62728'), (5, 8474, '#1f77b4')):
    w = rd(f'{R2}/window/canon-mxfp8_e4m3-s{sd}.csv')
    xs = [int(x['step']) - b for x in w]
    ser_l.append(dict(label=f'MX seed {sd} (B={b})', x=xs, y=[float(x['loss']) for x in w], color=col))
    ser_g.append(dict(label=f'MX seed {sd}', x=xs, y=[float(x['grad_norm']) for x in w], color=col))
    ser_s.append(dict(label=f'MX seed {sd}', x=xs, y=[float(x['sat_max']) for x in w], color=col))
ref = 0.00227
ser_l.append(dict(label='10 x ref (blow-up threshold)', x=[-600, 100], y=[10 * ref, 10 * ref], color='#000', dash='4,3'))
svg_figure(f'{OUT}/canon_onset.svg', [dict(ylabel='loss (every step), log', log=True, series=ser_l, vlines=[(0, 'B', '#000')]),
                                dict(ylabel='grad norm (global, before the update), log', log=True, series=ser_g, vlines=[(0, 'B', '#000')]),
                                dict(ylabel='saturated fraction, max over linears and roles', series=ser_s, vlines=[(0, 'B', '#000')])],
           (-150, 25), 'Blow-up onset, every step (x = step - B)', xlabel='step - B')
print('ok')
