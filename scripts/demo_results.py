"""What scripts/demo reads out of the CLI's JSON (Python 3 standard library only):

  python3 scripts/demo_results.py last-sweep < `keel sweeps --output json`
      prints the id of the newest sweep;
  python3 scripts/demo_results.py rescue < `keel runs SWEEP --output json`
      prints how many runs without a policy blew up at the demo's fault and how many with one
      finished healthy.

Both read the JSON that keel prints (ListSweepsResponse, ListRunsResponse with the proto field
names); a non-finite loss is the string "NaN", "Infinity" or "-Infinity" there.
"""
import json
import math
import sys

# A run finished healthy: it succeeded with a final loss under this (the demo's runs that blow up
# at the injected fault end far above it).
HEALTHY_LOSS = 0.1
# The sweep axis that turns the policy off: its runs have policy.max_interventions = 0.
POLICY_AXIS = "policy.max_interventions"

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def run_loss(run):
    """A run's loss as a float; NaN when the field is missing or not a number."""
    v = run.get("loss")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return _NON_FINITE.get(v, math.nan) if isinstance(v, str) else math.nan


def last_sweep_id(sweeps_response):
    """The id of the last sweep of a ListSweepsResponse (they come in creation order)."""
    sweeps = sweeps_response.get("sweeps") or []
    if not sweeps:
        raise ValueError("sweeps: the list is empty (want at least the sweep just submitted)")
    return sweeps[-1]["id"]


def healthy(run):
    return run.get("state") == "SUCCEEDED" and run_loss(run) < HEALTHY_LOSS


def rescue_lines(runs_response):
    """The demo's two result lines (after an empty one) for a ListRunsResponse."""
    runs = runs_response.get("runs") or []
    idle = [r for r in runs if (r.get("axes") or {}).get(POLICY_AXIS) == "0"]
    acting = [r for r in runs if (r.get("axes") or {}).get(POLICY_AXIS) != "0"]
    return ["",
            "policy off: %d of %d runs blew up at the step-150 fault (final loss > 0.1)"
            % (sum(not healthy(r) for r in idle), len(idle)),
            "policy on:  %d of %d runs were caught, rolled back, moved up the ladder and finished healthy (loss < 0.1)"
            % (sum(healthy(r) for r in acting), len(acting))]


COMMANDS = {"last-sweep": lambda doc: [last_sweep_id(doc)], "rescue": rescue_lines}


def main(argv, stdin, stdout, stderr):
    if len(argv) != 1 or argv[0] not in COMMANDS:
        stderr.write("usage: demo_results.py last-sweep|rescue < JSON (got %s)\n" % (" ".join(argv) or "no command"))
        return 2
    try:
        lines = COMMANDS[argv[0]](json.load(stdin))
    except KeyError as e:
        stderr.write("demo_results.py %s: keel's JSON on stdin has no field %s\n" % (argv[0], e))
        return 1
    except (ValueError, TypeError, AttributeError) as e:
        stderr.write("demo_results.py %s: cannot read keel's JSON on stdin: %s\n" % (argv[0], e))
        return 1
    for line in lines:
        stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin, sys.stdout, sys.stderr))
