#!/usr/bin/python3
"""grammar_check.py — checks the texts that test_grammar's random walks
produced: each JSON line {"kind": "schema"|"regex"|"json", "spec": ...,
"text": ...} must parse as JSON and validate against its schema
(jsonschema), or fullmatch its regex (Python's re). Exit 1 on any miss."""
import json
import re
import sys

import jsonschema


def check(item):
    kind, spec, text = item["kind"], item["spec"], item["text"]
    if kind == "regex":
        if not re.fullmatch(spec, text, re.ASCII):
            return "does not fullmatch"
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        return "not JSON: %s" % e
    if kind == "json":
        return None if isinstance(value, dict) else "not an object"
    try:
        jsonschema.validate(value, json.loads(spec))
    except jsonschema.ValidationError as e:
        return "invalid: %s" % e.message
    return None


def main():
    bad = n = 0
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            n += 1
            why = check(item)
            if why:
                bad += 1
                print("FAIL %s %r: %s\n  spec %s" % (item["kind"], item["text"],
                                                     why, item["spec"][:200]))
    print("grammar_check: %d texts, %d failed" % (n, bad))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
