#!/usr/bin/env python3
"""check_header.py: the public header (capi/goep_ep.h) declares every function
as the library defines it, and NCCL EP's functions with NCCL EP's parameters.

    check_header.py capi/goep_ep.h bin/capi/libgoep_ep.h bin/capi/libgoep_ep.so [capi/goep_ep_bench.h]

The library's Go functions are declared by cgo in the header it generates
(libgoep_ep.h), without const; their parameter types, const aside, must be
those of goep_ep.h, and every function goep_ep.h declares must be exported by
the library (nm -D). The benchmark's header (goep_ep_bench.h, not part of the
API), where given, declares the library's other exports, checked the same way. Each function of NCCL EP's API (nccl_ep.h, version 2),
renamed, must be declared with NCCL's number of parameters, a stream
(goepEpStream_t) last where NCCL's takes a cudaStream_t. Exits non-zero naming
each difference.
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


# NCCL EP's functions: their number of parameters, and whether the last is a stream.
NCCL_EP = {
    "goepEpGetVersion": (1, False), "goepEpTensorAlloc": (5, False), "goepEpTensorDestroy": (1, False),
    "goepEpCreateGroup": (3, False), "goepEpGroupDestroy": (1, False), "goepEpHandleMemSize": (5, False),
    "goepEpInitHandle": (6, False), "goepEpUpdateHandle": (4, True), "goepEpCreateHandle": (7, True),
    "goepEpHandleDestroy": (1, False), "goepEpDispatch": (6, True), "goepEpCombine": (5, True),
    "goepEpComplete": (3, True), "goepEpMaskQuery": (3, True), "goepEpMaskUpdate": (3, True),
    "goepEpMaskClean": (2, True), "goepEpGetAsyncError": (2, False), "goepEpErrorClear": (1, False),
}


def main() -> int:
    public, generated, lib = sys.argv[1:4]
    pub = prototypes(open(public).read())
    bench = prototypes(open(sys.argv[4]).read()) if len(sys.argv) > 4 else {}
    gen = prototypes(open(generated).read(), prefix=r"extern\s+")
    exported = set(re.findall(r" T (goepEp\w+)$", subprocess.run(["nm", "-D", lib], capture_output=True, text=True,
                                                                 check=True).stdout, flags=re.M))
    bad = []
    for header, decls in ((public, pub), (sys.argv[4] if bench else "", bench)):
        for name, sig in decls.items():
            if name not in exported:
                bad.append(f"{name}: declared in {header} but not exported by {lib}")
            if name in gen and gen[name] != sig:
                bad.append(f"{name}: {header} declares {sig}, the library (cgo) {gen[name]}")
    for name in gen:
        if name not in pub and name not in bench:
            bad.append(f"{name}: exported by the library but not declared in {public}")
    for name, (n, stream) in NCCL_EP.items():
        sig = pub.get(name)
        if sig is None:
            bad.append(f"{name}: NCCL EP's function is not declared in {public}")
        elif len(sig) - 1 != n:
            bad.append(f"{name}: {len(sig) - 1} parameters in {public}, NCCL EP's has {n}")
        elif stream != (sig[-1] == "goepEpStream_t"):
            bad.append(f"{name}: its last parameter is {sig[-1]}; NCCL EP's is {'a' if stream else 'not a'} stream")
    if len(pub) < 15:
        bad.append(f"only {len(pub)} functions found in {public}: the parser is broken")
    for b in bad:
        print("check_header:", b, file=sys.stderr)
    if not bad:
        print(f"check_header: {len(pub)} functions of {public} and {len(bench)} of the benchmark's header match the "
              f"library ({len(gen)} from Go, the rest from C)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
