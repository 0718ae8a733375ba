#!/usr/bin/env bash
# helm-check.sh lints the Helm chart strictly and runs helm/chartcheck: the
# chart rendered for several value sets and decoded strictly into the
# Kubernetes API types, plus the rendered config through `dedupgw validate`.
#
# helm is taken from $HELM, PATH or $(go env GOPATH)/bin, and installed with
# `go install` when none is found (slow the first time; the binary stays in
# $(go env GOPATH)/bin, the module and build caches make later installs fast).
set -euo pipefail

helm_version=v3.22.0
t0=$(date +%s)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

helm_bin=${HELM:-}
if [[ -z $helm_bin ]]; then
	gobin_helm="$(go env GOPATH)/bin/helm"
	if command -v helm >/dev/null && helm version --short 2>/dev/null | grep -q '^v3\.'; then
		helm_bin=$(command -v helm)
	elif [[ -x $gobin_helm ]]; then
		helm_bin=$gobin_helm
	else
		echo "helm-check: installing helm $helm_version with go install"
		go install "helm.sh/helm/v3/cmd/helm@$helm_version"
		helm_bin=$gobin_helm
	fi
fi
echo "helm-check: using $helm_bin ($("$helm_bin" version --short)) after $(($(date +%s) - t0))s"

"$helm_bin" lint --strict "$repo/helm/dedupgw"

cd "$repo/helm/chartcheck"
HELM=$helm_bin go vet ./...
HELM=$helm_bin go test -race -count=1 ./...
echo "helm-check: done in $(($(date +%s) - t0))s"
