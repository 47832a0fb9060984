#!/usr/bin/env python3
"""Counts a pytest JUnit report's cases (passed, failed, skipped) and names the failures; used by
the device scripts (python_device.sh, python_h200.sh).

usage: scripts/junit_summary.py REPORT.xml [MAX_FAILURES]  (as a module: summarize(path))
"""
import sys
import xml.etree.ElementTree as ET


def summarize(path, width=200):
    """(counts, failures) of a JUnit report; raises when the report cannot be read."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    for c in ET.parse(path).getroot().iter("testcase"):
        kind = next((k.tag for k in c if k.tag in ("failure", "error", "skipped")), "passed")
        if kind in ("failure", "error"):
            counts["failed"] += 1
            msg = (next(k for k in c if k.tag in ("failure", "error")).get("message") or "").splitlines()
            failed.append(f"{c.get('classname')}::{c.get('name')}: {msg[0][:width] if msg else ''}")
        else:
            counts["skipped" if kind == "skipped" else "passed"] += 1
    return counts, failed


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        counts, failed = summarize(argv[1])
    except Exception as e:  # the build or collection failed before pytest wrote a report
        print("no JUnit report:", e)
        return 0
    for f in failed[: int(argv[2]) if len(argv) > 2 else 25]:
        print("FAILED", f)
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
