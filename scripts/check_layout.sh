#!/usr/bin/env bash
# Checks the layout rules of docs/architecture.md ("Rooms and their doors"):
#  1. nothing directly in ps/ (the core) includes ps/client/, ps/server/ or storage/;
#  2. storage/ includes only the ps core (no ps/client/, ps/server/, worker/);
#  3. ps/client/ includes no ps/server/ or storage/ (a client links no RocksDB), nor ps/coord/
#     or ps/control/ (it links no etcd client; tessera-ctl lives in ps/control/); ps/server/
#     includes no ps/client/ or ps/control/, but for tessera-server's main() (server_main.cc),
#     which runs the controller; ps/control/ (the resharding controller) includes no ps/server/
#     or storage/ (it is a client of the servers);
#  4. worker/ includes only the ps core and ps/client/ (no ps/server/, storage/); ps/metrics/
#     includes only the ps core, and the client does not include it; ps/coord/ (etcd) includes
#     only the ps core;
#  5. no source file is over 700 lines;
#  6. no function in a source file is over 80 lines unless a comment in the 6 lines above its
#     first line says why ("long function: <reason>").
# Rules 5 and 6 cover every .cc, .cu and .h file (headers hold inline and template bodies too)
# under ps/ (all its rooms), storage/, worker/, python/, benchmarks/ and examples/; the unit
# tests in those folders count, tests/ (the multi-process tests) is left out.
# A function is a braced block opened by a statement at namespace or class scope (any indent):
# a definition, a TEST body or a lambda assigned to a variable (`auto run = [&](...) {`), its
# signature on one line or several; it runs from the statement's first line (template line
# included) to the line that starts with `}` at that first line's indent (`}`, `};`, `});`, with
# or without a comment after it). Everything inside it counts toward its length, a lambda in it
# too. Not functions: namespace, class, struct, union, enum and extern "C" scopes, and braced
# initializers (`kTable[] = {`, `kTool{`: no `)` or `]` before the brace, or `= {`). Comments, string and raw string literals and preprocessor lines are
# skipped while looking for statements. The guard expects clang-format's layout: it reports, as
# violations, a block whose closing line it cannot find and a statement such as `if (` or
# `return` seen outside any function, since a brace it lost could hide a long function.
# Prints each violation and exits 1 when there is any.
# Usage: bash scripts/check_layout.sh              all rules on the tree
#        bash scripts/check_layout.sh --files F... rules 5 and 6 on the files F
#        (scripts/check_layout_test.sh tests rules 5 and 6 on small files)
set -uo pipefail
bad=0
violation() { echo "layout: $*"; bad=1; }

# Rule 6 in awk (POSIX awk and mawk): reads the files given, prints each violation, exits 1 when
# there is any.
function_rule='
  function reset_file() {
    raw = ""; incomment = 0; inpp = 0; pend = 0; mode = 0
  }
  # The code of line s: comments, and the contents of string, character and raw string
  # literals, removed (literals become ""); trailing blanks dropped. Keeps raw and incomment
  # across lines.
  function code_of(s,   i, n, c, q, out, d, k) {
    out = ""; n = length(s); q = ""; i = 1
    if (raw != "") {
      k = index(s, raw)
      if (k == 0) return ""
      i = k + length(raw); out = "\"\""; raw = ""
    }
    for (; i <= n; i++) {
      c = substr(s, i, 1)
      if (incomment) {
        if (c == "*" && substr(s, i + 1, 1) == "/") { incomment = 0; i++ }
        continue
      }
      if (q != "") {
        if (c == "\\") i++
        else if (c == q) { q = ""; out = out c }
        continue
      }
      if (c == "/" && substr(s, i + 1, 1) == "/") break
      if (c == "/" && substr(s, i + 1, 1) == "*") { incomment = 1; i++; continue }
      if (c == "R" && substr(s, i + 1, 1) == "\"" && (i == 1 || substr(s, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
        d = substr(s, i + 2); k = index(d, "(")
        if (k > 0) {
          raw = ")" substr(d, 1, k - 1) "\""
          d = substr(d, k + 1); k = index(d, raw)
          out = out "\"\""
          if (k == 0) return out        # the raw string goes on past this line
          i = n - length(d) + k + length(raw) - 1; raw = ""
          continue
        }
      }
      if (c == "\"" || (c == "\047" && substr(s, i - 1, 1) !~ /[0-9]/)) { q = c; out = out c; continue }
      out = out c
    }
    sub(/[ \t]+$/, "", out)
    return out
  }
  function reason(line,   i) {
    for (i = line - 1; i >= line - 6 && i > 0; --i) if (prev[i % 64] ~ /long function:/) return 1
    return 0
  }
  function strip_template(t,   i, n, depth, c) {
    if (t !~ /^template[ <]/) return t
    n = length(t); depth = 0
    for (i = 9; i <= n; i++) {
      c = substr(t, i, 1)
      if (c == "<") depth++
      else if (c == ">" && --depth == 0) break
    }
    t = substr(t, i + 1); sub(/^ +/, "", t)
    return t
  }
  function report(what) {
    printf "layout: %s:%d: %s: %s\n", fname, fstart, what, name
    found = 1
  }
  FNR == 1 {
    if (mode != 0) report("block not closed at its indent by the end of the file (the guard cannot measure it)")
    reset_file(); fname = FILENAME
  }
  {
    prev[FNR % 64] = $0
    if (mode != 0) {                   # inside a function or another block: find its end
      if (raw != "" || incomment || index($0, "R\"") || index($0, "/*")) {
        was_plain = (raw == "" && !incomment)
        code = code_of($0)
        if (!was_plain) next           # the line starts inside a literal or comment
      }
      if (substr($0, 1, length(findent) + 1) != findent "}") next
      if ($0 ~ /^ *\} *catch[ (]/) next  # a function try block goes on
      if (mode == 1 && FNR - fstart + 1 > 80 && !ok)
        report(sprintf("function of %d lines (at most 80 without a reason)", FNR - fstart + 1))
      mode = 0
      next
    }
    if (inpp) { inpp = ($0 ~ /\\$/); next }
    code = code_of($0)
    if (code ~ /^[ \t]*$/) next
    if (code ~ /^[ \t]*#/) { inpp = (code ~ /\\$/); next }
    if (pend == 0) {
      pend = FNR; match(code, /^ */); pindent = substr(code, 1, RLENGTH); text = ""; first = $0
      ok = reason(FNR)
      if (code ~ /^ *(if|else|for|while|do|switch|case|return|break|continue|goto)([^A-Za-z0-9_]|$)/) {
        fstart = FNR; name = $0
        report("a statement outside any function (the guard lost a brace; is the file clang-formatted?)")
      }
    }
    t = code; sub(/^[ \t]+/, "", t)
    text = (text == "") ? t : text " " t
    last = substr(code, length(code), 1)
    if (last == ";" || last == "}" || code ~ /^ *(public|protected|private) *:$/) { pend = 0; next }
    if (last != "{") next
    t = strip_template(text)
    pend_start = pend; pend = 0
    if (t ~ /^((inline|export) +)*(namespace|class|struct|union|enum)([^A-Za-z0-9_(]|$)/ ||
        t ~ /^extern +"" *\{$/)
      next                             # a scope: its members are statements in turn
    fstart = pend_start; findent = pindent; name = first
    mode = (text ~ /= *\{$/ || text !~ /[)\]]/) ? 2 : 1   # 2: a braced initializer or the like
    next
  }
  END {
    if (mode != 0) report("block not closed at its indent by the end of the file (the guard cannot measure it)")
    exit found
  }'

# Rules 5 and 6 on the files given.
check_files() {
  local f n
  for f in "$@"; do
    n=$(wc -l <"$f")
    ((n > 700)) && violation "$f has $n lines (at most 700)"
  done
  (($# == 0)) || awk "$function_rule" "$@" || bad=1
}

if [[ ${1-} == --files ]]; then
  shift
  check_files "$@"
  if ((bad == 0)); then echo "layout: all rules hold"; fi
  exit $bad
fi
cd "$(dirname "$0")/.."

check_includes() {  # check_includes DESCRIPTION PATTERN FILES...
  local what=$1 pattern=$2
  shift 2
  local hits
  hits=$(grep -nE "^#include \"($pattern)" "$@" 2>/dev/null)
  if [[ -n $hits ]]; then
    while IFS= read -r h; do violation "$what: $h"; done <<<"$hits"
  fi
}

core=$(find ps -maxdepth 1 -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "ps core includes a room above it" 'ps/client/|ps/server/|storage/' $core
check_includes "storage includes more than the ps core" 'ps/client/|ps/server/|worker/' \
  $(find storage -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "the client includes server or storage code" 'ps/server/|storage/' \
  $(find ps/client -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "the client includes the coordination or controller rooms" 'ps/coord/|ps/control/' \
  $(find ps/client -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "the server library includes client or controller code" 'ps/client/|ps/control/' \
  $(find ps/server -type f \( -name '*.h' -o -name '*.cc' \) ! -name server_main.cc)
check_includes "the controller includes server or storage code" 'ps/server/|storage/' \
  $(find ps/control -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "metrics include more than the ps core" 'ps/client/|ps/server/|storage/|worker/' \
  $(find ps/metrics -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "the client includes the metrics room (it links no HTTP library)" 'ps/metrics/' \
  $(find ps/client -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "coord includes more than the ps core" 'ps/client/|ps/server/|ps/metrics/|storage/|worker/' \
  $(find ps/coord -type f \( -name '*.h' -o -name '*.cc' \))
check_includes "worker includes server or storage code" 'ps/server/|storage/' \
  $(find worker -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \))

check_files $(find ps storage worker python benchmarks examples -type f \
  \( -name '*.cc' -o -name '*.cu' -o -name '*.h' \) | sort)

if ((bad == 0)); then echo "layout: all rules hold"; fi
exit $bad
