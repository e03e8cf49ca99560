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
#  5. no .cc file under ps/ is over 700 lines;
#  6. no function in a .cc file under ps/ is over 80 lines unless the comment above it says
#     why ("long function: ...").
# Prints each violation and exits 1 when there is any. Usage: bash scripts/check_layout.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bad=0
violation() { echo "layout: $*"; bad=1; }

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

for f in $(find ps -type f -name '*.cc'); do
  n=$(wc -l <"$f")
  ((n > 700)) && violation "$f has $n lines (at most 700)"
  # Function bodies: a definition line ending in '{' at column 0 (or 2, inside a class) up to
  # the closing brace at the same indent.
  awk -v file="$f" '
    function reason(   i) {
      for (i = NR - 1; i >= NR - 6 && i > 0; --i) if (prev[i % 8] ~ /long function:/) return 1
      return 0
    }
    {
      prev[NR % 8] = $0
      if (start == 0 && $0 ~ /^(  )?[A-Za-z].*\)( const)?( override)?( -> [^{]*)? \{$/ &&
          $0 !~ /^(  )?(namespace|class|struct|enum|if|for|while|switch|else|do)[ (]/) {
        start = NR; indent = ($0 ~ /^  /) ? "  " : ""; name = $0; ok = reason(); next
      }
      if (start != 0 && $0 == indent "}") {
        if (NR - start + 1 > 80 && !ok) {
          printf "layout: %s:%d: function of %d lines (at most 80 without a reason): %s\n",
                 file, start, NR - start + 1, name
          found = 1
        }
        start = 0
      }
    }
    END { exit found }' "$f" || bad=1
done

if ((bad == 0)); then echo "layout: all rules hold"; fi
exit $bad
