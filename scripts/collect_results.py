#!/usr/bin/env python3
"""Merges the JSON record files of one H200 run (bench, PyTorch peer, serve_loop) into the list
kept in docs/results/h200.json: records of the same (suite, name, variant, metric) are replaced
by the newer run's, others are kept.

usage: scripts/collect_results.py docs/results/h200.json RUN_FILE.json [RUN_FILE.json ...]
"""
import json
import os
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    target, runs = argv[1], argv[2:]
    records = json.load(open(target)) if os.path.exists(target) else []
    key = lambda r: (r["suite"], r["name"], r["variant"], r["metric"])
    merged = {key(r): r for r in records}
    for path in runs:
        for r in json.load(open(path)):
            merged[key(r)] = r
    out = sorted(merged.values(), key=lambda r: (r["suite"], r["name"], r["variant"], r["metric"]))
    with open(target, "w") as f:
        f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in out) + "\n]\n")
    print(f"{target}: {len(out)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
