// Package chartcheck is the offline check of the dedupgw Helm chart: its
// tests render the chart with `helm template` for several value sets and
// decode every document strictly into the Kubernetes API types, so unknown
// fields and wrong types fail without a cluster, kubectl or kubeconform.
//
// It is a module of its own so the gateway's module does not depend on
// k8s.io/api. Run it with `cd helm/chartcheck && go test ./...`, or through
// .ci/helm-check.sh, which installs helm first.
package chartcheck
