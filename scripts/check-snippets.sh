#!/usr/bin/env bash
# check-snippets.sh: the Go, C and Python snippets of the documents below are lines of complete
# programs, and those programs build and give the values of their own reference (make test-snippets,
# part of make test; about half a minute here, after make capi).
#
#   scripts/check-snippets.sh [--no-run]
#
# Every ```go, ```c and ```python block of DOCS is preceded by a marker naming the program it comes
# from, a path from the repository's root:
#
#   <!-- snippet: examples/readme/main.go -->
#
# and its lines, blank ones left out, must be lines of that file in the same order (other lines may
# come between them: error checks, the data a snippet takes as given), compared with the spaces at
# either end removed and runs of spaces inside taken as one. Then each program named runs at 2 ranks
# under mpirun: a Go main package is vetted and built with -tags mpi, a C file compiled with mpicc
# -Werror against bin/capi/libgoep_ep.so, a Python file run by PYTHON with the package from python/.
# --no-run checks the lines only.
set -euo pipefail
cd "$(dirname "$0")/.."

DOCS=(README.md docs/capi.md)
GO=${GO:-go}
MPIRUN=${MPIRUN:-mpirun}
MPICC=${MPICC:-mpicc}
PYTHON=${PYTHON:-/usr/bin/python3}
LIMIT=${SNIPPET_TIMEOUT:-120}
run=1
for a in "$@"; do
  case "$a" in
    --no-run) run=0 ;;
    *) echo "check-snippets.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

# The lines: one program path per line on stdout, each once, in the order first named.
programs=$("$PYTHON" - "${DOCS[@]}" <<'PY'
import re
import sys

LANGS = {"go", "c", "python"}
MARKER = re.compile(r"^<!--\s*snippet:\s*(\S+)\s*-->\s*$")


def norm(line):
    return " ".join(line.split())


failed, named = False, []
for doc in sys.argv[1:]:
    lines = open(doc, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence or not fence.group(1):
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        i = end + 1
        if lang not in LANGS:
            continue
        where = f"{doc}:{start}"
        marker = MARKER.match(lines[start - 2]) if start >= 2 else None
        if not marker:
            print(f"check-snippets: {where}: a ```{lang} block without a <!-- snippet: path --> line before it", file=sys.stderr)
            failed = True
            continue
        path = marker.group(1)
        try:
            source = [norm(l) for l in open(path, encoding="utf-8").read().split("\n")]
        except OSError as e:
            print(f"check-snippets: {where}: {e}", file=sys.stderr)
            failed = True
            continue
        at = 0
        for n, line in enumerate(lines[start:end], start + 1):
            want = norm(line)
            if not want:
                continue
            try:
                at = source.index(want, at) + 1
            except ValueError:
                print(f"check-snippets: {doc}:{n}: not a line of {path} (after its line {at}):\n  {line.strip()}", file=sys.stderr)
                failed = True
                break
        if path not in named:
            named.append(path)
if failed:
    sys.exit(1)
print("\n".join(named))
PY
)
echo "check-snippets: the snippets of ${DOCS[*]} are lines of: $(echo $programs)"
[ "$run" = 1 ] || exit 0

flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
work=$(mktemp -d /tmp/goep-snippets.XXXXXX)
trap 'rm -rf "$work"' EXIT
mpi() {
  echo "+ mpirun -np 2 $*"
  timeout "$LIMIT" "$MPIRUN" "${flags[@]}" -x PYTHONPATH -np 2 "$@"
}
export PYTHONPATH="$PWD/python"
unset GOEP_EP_LIB

for p in $programs; do
  echo "== $p"
  case "$p" in
    *.go)
      "$GO" vet -tags mpi "./$(dirname "$p")"
      "$GO" build -tags mpi -o "$work/go-prog" "./$(dirname "$p")"
      mpi "$work/go-prog"
      ;;
    *.c)
      [ -f bin/capi/libgoep_ep.so ] || { echo "check-snippets: $p needs bin/capi/libgoep_ep.so (make capi)" >&2; exit 1; }
      "$MPICC" -std=c11 -O2 -Wall -Wextra -Werror -Icapi -o "$work/c-prog" "$p" -Lbin/capi -lgoep_ep -Wl,-rpath,"$PWD/bin/capi"
      mpi "$work/c-prog"
      ;;
    *.py)
      mpi "$PYTHON" "$p"
      ;;
    *)
      echo "check-snippets: $p: no way to run it (a .go, .c or .py file)" >&2
      exit 1
      ;;
  esac
done
echo "check-snippets: ok"
