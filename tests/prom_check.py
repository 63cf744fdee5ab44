#!/usr/bin/env python3
"""Strict checker of the Prometheus text exposition format (version 0.0.4) for the tests.

Reads stdin; exits 0 if it is valid, else prints each problem and exits 1. Checks: line
syntax (# HELP / # TYPE / samples), metric and label names, label value escaping, float
values, TYPE given once per family and before its samples, HELP at most once, samples of a
family contiguous, no duplicate series, counters named *_total.
"""
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN)"
LABEL_PAIR = rf'{LABEL}="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{(?:{LABEL_PAIR}(?:,{LABEL_PAIR})*,?)?\}})? ({VALUE})( -?\d+)?$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def main():
    problems = []
    types, helps, seen_series = {}, set(), set()
    closed, current = set(), None
    for n, line in enumerate(sys.stdin.read().split("\n"), 1):
        if line == "":
            continue
        if line.startswith("#"):
            m = re.match(rf"^# (HELP|TYPE) ({NAME}) (.*)$", line)
            if not m:
                if line.startswith("# HELP") or line.startswith("# TYPE"):
                    problems.append(f"line {n}: malformed comment: {line}")
                continue
            kind, name, rest = m.groups()
            if kind == "TYPE":
                if rest not in TYPES:
                    problems.append(f"line {n}: unknown type {rest}")
                if name in types:
                    problems.append(f"line {n}: second TYPE for {name}")
                if name in closed or name == current:
                    problems.append(f"line {n}: TYPE for {name} after its samples")
                types[name] = rest
                if rest == "counter" and not name.endswith("_total"):
                    problems.append(f"line {n}: counter {name} does not end in _total")
            else:
                if name in helps:
                    problems.append(f"line {n}: second HELP for {name}")
                helps.add(name)
            continue
        m = SAMPLE.match(line)
        if not m:
            problems.append(f"line {n}: malformed sample: {line}")
            continue
        name, labels = m.group(1), m.group(2) or ""
        if name != current:
            if name in closed:
                problems.append(f"line {n}: samples of {name} are not contiguous")
            if current is not None:
                closed.add(current)
            current = name
        if name not in types:
            problems.append(f"line {n}: sample of {name} without a TYPE line")
        if (name, labels) in seen_series:
            problems.append(f"line {n}: duplicate series {name}{labels}")
        seen_series.add((name, labels))
    if not seen_series:
        problems.append("no samples")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
