#!/usr/bin/env bash
# NOT RUN HERE: written on a machine with no Docker and no cluster; it has never been run.
#
# A smoke test of deploy/ on a real, disposable cluster (kind or k3d; KEDA installed):
#
#   kind create cluster --name plumber && <install KEDA> && deploy/smoke.sh
#
# It checks that the API server accepts the Topology CRD (`plumber crd`), that `kubectl
# apply -k deploy/` applies, that the daemon's ServiceAccount may do what the daemon needs
# and may not read Secrets, and that a Topology's status shows in `kubectl get topologies`.
# With SMOKE_BUILD=1 it also builds both images, loads them into the cluster and tries the
# processor image's init-container copy; with SMOKE_DAEMON=1 it waits for the daemon to roll
# out (`plumber daemon` is not built yet, so that fails until it is). SMOKE_KEEP=1 leaves
# everything installed.
set -euo pipefail
cd "$(dirname "$0")/.."

context=$(kubectl config current-context)
case "$context" in
kind-* | k3d-*) ;;
*)
    if [[ "${SMOKE_ANY_CONTEXT:-}" != 1 ]]; then
        echo "error: the kubectl context $context is not a kind-* or k3d-* cluster; this test" >&2
        echo "installs and deletes things: set SMOKE_ANY_CONTEXT=1 if that is what you want" >&2
        exit 2
    fi
    ;;
esac
namespace=plumber
processor_image=ghcr.io/plumber-dev/plumber-processor:0.1.0
daemon_image=ghcr.io/plumber-dev/plumber:0.1.0

step() { echo "--- $*"; }
fail() {
    echo "FAILED: $*" >&2
    exit 1
}

step "the API server accepts the Topology CRD as plumber crd prints it"
cargo run --quiet -- crd | kubectl apply --server-side --field-manager=plumber-smoke -f -
kubectl wait --for=condition=Established crd/topologies.plumber.dev --timeout=60s

step "KEDA is installed (the daemon creates ScaledObjects)"
kubectl get crd scaledobjects.keda.sh triggerauthentications.keda.sh >/dev/null ||
    fail "install KEDA first"

if [[ "${SMOKE_BUILD:-}" == 1 ]]; then
    step "images"
    docker build -f deploy/docker/plumber.Dockerfile -t "$daemon_image" .
    docker build -f deploy/docker/processor.Dockerfile -t "$processor_image" .
    docker run --rm "$daemon_image" --version
    docker run --rm "$daemon_image" crd | diff - deploy/crd.yaml || fail "the image's CRD differs"
    docker run --rm "$processor_image" --help >/dev/null
    # The init container of an exec step: copy the binary without a shell, as non-root.
    copy=$(mktemp -d)
    chmod 0777 "$copy"
    docker run --rm -v "$copy:/plumber/bin" --entrypoint /usr/local/bin/cp "$processor_image" \
        /plumber-processor /plumber/bin/plumber-processor
    [[ -x "$copy/plumber-processor" ]] || fail "the copied plumber-processor is not executable"
    # …and the copy runs in another glibc image (what a user's exec image must provide).
    docker run --rm -v "$copy:/plumber/bin:ro" debian:bookworm-slim \
        /plumber/bin/plumber-processor --help >/dev/null ||
        fail "the copied plumber-processor does not run in debian:bookworm-slim"
    rm -rf "$copy"
    case "$context" in
    kind-*) kind load docker-image --name "${context#kind-}" "$daemon_image" "$processor_image" ;;
    k3d-*) k3d image import --cluster "${context#k3d-}" "$daemon_image" "$processor_image" ;;
    esac
fi

step "kubectl apply -k deploy/"
kubectl apply --server-side --field-manager=plumber-smoke -k deploy/

step "the daemon's ServiceAccount may do what the daemon needs, and no more"
as=(--as "system:serviceaccount:$namespace:plumber" -n "$namespace")
for allowed in \
    "patch topologies.plumber.dev" "delete topologies.plumber.dev" \
    "update topologies.plumber.dev --subresource=status" \
    "create events.events.k8s.io" \
    "patch statefulsets.apps" "delete statefulsets.apps" \
    "patch scaledobjects.keda.sh" "patch triggerauthentications.keda.sh" \
    "watch pods" "create leases.coordination.k8s.io" \
    "patch leases.coordination.k8s.io/plumber"; do
    # shellcheck disable=SC2086 # the words of $allowed are kubectl's arguments
    kubectl auth can-i $allowed "${as[@]}" >/dev/null || fail "the daemon may not $allowed"
done
for denied in "get secrets" "list secrets" "delete pods" "patch leases.coordination.k8s.io/other" \
    "create customresourcedefinitions.apiextensions.k8s.io"; do
    # shellcheck disable=SC2086
    if kubectl auth can-i $denied "${as[@]}" >/dev/null 2>&1; then
        fail "the daemon may $denied"
    fi
done
if kubectl auth can-i get statefulsets.apps --as "system:serviceaccount:$namespace:plumber" \
    -n default >/dev/null 2>&1; then
    fail "the daemon may act outside its namespace"
fi

step "a Topology's status shows in kubectl get topologies"
kubectl apply --server-side --field-manager=plumber-smoke -f - <<YAML
apiVersion: plumber.dev/v1alpha1
kind: Topology
metadata: { name: smoke, namespace: $namespace }
spec: { topology: smoke, repository: "https://git.example/smoke.git", ref: main }
YAML
kubectl patch topology smoke -n "$namespace" --subresource=status --type=merge -p '{"status": {
  "commit": "0123456789abcdef0123456789abcdef01234567", "shortCommit": "0123456789ab",
  "phase": "Idle", "stepsReady": "1/1", "lag": 0,
  "steps": [{"name": "moving", "kind": "processor", "state": "Running", "replicas": 1, "running": 1}],
  "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "",
                  "lastTransitionTime": "2026-01-01T00:00:00Z"}],
  "record": {"format": 2, "anything": {"kept": true}}}}'
listed=$(kubectl get topologies -n "$namespace")
echo "$listed"
grep -q 'COMMIT.*PHASE.*STEPS.*LAG.*AGE' <<<"$listed" || fail "printer columns missing"
grep -q 'smoke .*0123456789ab .*Idle .*1/1 .*0' <<<"$listed" || fail "status columns missing"
kept=$(kubectl get topology smoke -n "$namespace" -o jsonpath='{.status.record.anything.kept}')
[[ "$kept" == true ]] || fail "the API server pruned the opaque cutover record"
kubectl delete topology smoke -n "$namespace"

if [[ "${SMOKE_DAEMON:-}" == 1 ]]; then
    step "the daemon rolls out"
    kubectl rollout status deployment/plumber -n "$namespace" --timeout=180s
fi

if [[ "${SMOKE_KEEP:-}" != 1 ]]; then
    step "clean up"
    kubectl delete -k deploy/ --ignore-not-found
fi
echo "smoke test passed"
