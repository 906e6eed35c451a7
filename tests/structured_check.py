"""structured_check.py CASES.json — the structured-output answers a test
collected, checked by libraries we did not write: each case is
{"what": name, "text": the answer, and one of
 "schema": a JSON schema (the text must parse as JSON and validate with
           Debian's python3-jsonschema, Draft 2020-12),
 "regex": a pattern (re.fullmatch, the text as a whole),
 "choice": a list of strings (the text is one of them)}.
Prints each failure; exit 1 when any, 2 when the file holds no case."""
import json
import re
import sys

import jsonschema


def check(case):
    text = case["text"]
    if "schema" in case:
        try:
            value = json.loads(text)
        except ValueError as e:
            return "not JSON (%s): %r" % (e, text)
        v = jsonschema.Draft202012Validator(case["schema"])
        errs = sorted(v.iter_errors(value), key=lambda e: list(e.path))
        if errs:
            return "invalid: %s: %r" % (errs[0].message, text)
        return None
    if "regex" in case:
        return None if re.fullmatch(case["regex"], text) else \
            "does not match %r: %r" % (case["regex"], text)
    if "choice" in case:
        return None if text in case["choice"] else "not one of %r: %r" % (case["choice"], text)
    return "a case with nothing to check: %r" % case


def main():
    cases = json.load(open(sys.argv[1]))
    if not cases:
        print("structured_check: no cases")
        sys.exit(2)
    bad = 0
    for c in cases:
        why = check(c)
        if why:
            bad += 1
            print("FAIL %s: %s" % (c.get("what", "?"), why))
    print("structured_check: %d cases, %d failed" % (len(cases), bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
