#!/usr/bin/env bash
# Point the wrapper module at one k8s.io/kubernetes release.
#
# k8s.io/kubernetes requires its staging modules at the unresolvable v0.0.0 and maps them to
# ./staging/src/... with replace lines that only apply inside its own repository. This script
# reads those replace lines from the release's own go.mod (in the module cache) and replaces
# each staging module with its published v0.<minor>.<patch>, so the list always matches the
# release instead of being typed by hand.
#
# usage: tests/cluster/pin-kubernetes.sh v1.37.2
set -euo pipefail
version="${1:?usage: pin-kubernetes.sh v1.X.Y}"
staging_version="v0.${version#v1.}"
cd "$(dirname "$0")"

gomod="$(go mod download -json "k8s.io/kubernetes@${version}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
mapfile -t staging < <(sed -n 's|^[[:space:]]*\([^[:space:]]*\) => ./staging/src/.*|\1|p' "$gomod")
if [ "${#staging[@]}" -eq 0 ]; then
    echo "pin-kubernetes: no staging replace lines found in $gomod" >&2
    exit 1
fi

# Drop every k8s.io replace left from an earlier pin, then write the current list.
for old in $(go mod edit -json | python3 -c 'import json,sys; print(" ".join(r["Old"]["Path"] for r in json.load(sys.stdin).get("Replace") or []))'); do
    go mod edit -dropreplace="$old"
done
go mod edit -require="k8s.io/kubernetes@${version}"
for module in "${staging[@]}"; do
    go mod edit -replace="${module}=${module}@${staging_version}"
done
go mod tidy
echo "pinned k8s.io/kubernetes ${version}; ${#staging[@]} staging modules at ${staging_version}"
