#!/usr/bin/env bash
# test_layering.sh - no source file includes a header of a higher floor (DESIGN.md section 3):
#   core, kernels (0) -> plan (1) -> program (2) -> fabric (3) -> api (4)
# A file may include its own folder and any lower floor, never a higher one nor another
# folder of its own floor.  (The argument, tide-plan's path, is not used.)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
declare -A floor=([core]=0 [kernels]=0 [plan]=1 [program]=2 [fabric]=3 [api]=4)
bad=0
for dir in "${!floor[@]}"; do
    while IFS= read -r -d '' f; do
        while IFS= read -r inc; do
            [ -n "$inc" ] || continue
            if [ -z "${floor[$inc]+x}" ]; then
                echo "FAIL: ${f#$root/} includes \"$inc/...\", a folder outside the floors"
                bad=1
            elif [ "$inc" != "$dir" ] && [ "${floor[$inc]}" -ge "${floor[$dir]}" ]; then
                echo "FAIL: ${f#$root/} (floor ${floor[$dir]}, $dir) includes $inc/ (floor ${floor[$inc]})"
                bad=1
            fi
        done < <(grep -hoE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[a-z_]+/' "$f" |
                 sed -E 's/.*"([a-z_]+)\//\1/' | sort -u)
    done < <(find "$root/src/$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
done
[ "$bad" = 0 ] && echo "PASS: every include points to the same or a lower floor"
exit $bad
