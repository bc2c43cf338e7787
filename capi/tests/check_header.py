#!/usr/bin/env python3
"""check_header.py: the public header (capi/goep_ep.h) declares every function
as the library defines it.

    check_header.py capi/goep_ep.h bin/capi/libgoep_ep.h bin/capi/libgoep_ep.so

The library's Go functions are declared by cgo in the header it generates
(libgoep_ep.h), without const; their parameter types, const aside, must be
those of goep_ep.h, and every function goep_ep.h declares must be exported by
the library (nm -D). Exits non-zero naming each difference.
"""

import re
import subprocess
import sys


def prototypes(text: str, prefix: str = "") -> dict[str, list[str]]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out = {}
    for m in re.finditer(prefix + r"\b(goepEpResult_t|size_t|const char\s*\*)\s*(goepEp\w+)\s*\(([^)]*)\)\s*;", text):
        params = []
        for p in m.group(3).split(","):
            p = re.sub(r"\bconst\b", " ", p).replace("*", " * ")
            words = p.split()
            if words == ["void"] or not words:
                continue
            if words[-1] != "*" and len(words) > 1:
                words = words[:-1]  # the parameter's name
            params.append(" ".join(words))
        out[m.group(2)] = [m.group(1).replace(" ", "")] + params
    return out


def main() -> int:
    public, generated, lib = sys.argv[1:4]
    pub = prototypes(open(public).read())
    gen = prototypes(open(generated).read(), prefix=r"extern\s+")
    exported = set(re.findall(r" T (goepEp\w+)$", subprocess.run(["nm", "-D", lib], capture_output=True, text=True,
                                                                 check=True).stdout, flags=re.M))
    bad = []
    for name, sig in pub.items():
        if name not in exported:
            bad.append(f"{name}: declared in {public} but not exported by {lib}")
        if name in gen and gen[name] != sig:
            bad.append(f"{name}: {public} declares {sig}, the library (cgo) {gen[name]}")
    for name in gen:
        if name not in pub and name != "goepEpBenchGoRounds":
            bad.append(f"{name}: exported by the library but not declared in {public}")
    if len(pub) < 15:
        bad.append(f"only {len(pub)} functions found in {public}: the parser is broken")
    for b in bad:
        print("check_header:", b, file=sys.stderr)
    if not bad:
        print(f"check_header: {len(pub)} functions of {public} match the library ({len(gen)} from Go, the rest from C)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
