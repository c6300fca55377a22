import csv, sys, collections
# Sums ncu --csv gpu__time_duration per kernel name; divides by the step count given.
path, steps = sys.argv[1], float(sys.argv[2])
tot = collections.defaultdict(float); cnt = collections.Counter()
rows = [l for l in open(path, errors='replace')]
start = next(i for i, l in enumerate(rows) if l.startswith('"ID"'))
for r in csv.DictReader(rows[start:]):
    if r.get('Metric Name') != 'gpu__time_duration.sum': continue
    v = float(r['Metric Value'].replace(',', ''))
    unit = r['Metric Unit']
    us = {"nsecond": v / 1000, "ns": v / 1000, "usecond": v, "us": v, "msecond": v * 1000, "ms": v * 1000}[unit]
    tot[r['Kernel Name'][:110]] += us; cnt[r['Kernel Name'][:110]] += 1
all_us = sum(tot.values())
print('kernels per step %.0f, device ms per step %.3f' % (sum(cnt.values()) / steps, all_us / steps / 1000))
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:45]:
    print('%9.1f us %6.1f  %s' % (v / steps, cnt[k] / steps, k))
