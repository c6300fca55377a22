"""The reproduction programs of docs/reproductions/ (Python 3 standard library only).

scripts/reproduce-mx-instability and scripts/reproduce-mx-policy run mx_instability.py and
mx_policy.py; runs.py reads keel-train's run directories, criteria.py holds the blow-up criterion
and the per-run statistics, report.py writes the tables and CSVs, svg.py draws the plots.
"""
