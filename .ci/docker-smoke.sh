#!/usr/bin/env bash
# docker-smoke.sh builds the project's Dockerfile with a real Docker engine and
# runs the image: /healthz answers, and one webhook delivered twice reaches the
# upstream once (the second answer says "Dedup-Status: duplicate").
#
# No container registry is reachable, so the script:
#   - installs Debian's docker.io (dockerd + BuildKit) when dockerd is missing;
#   - starts its own dockerd on its own socket and data root, without a bridge
#     or iptables rules (containers use the host's network namespace, so every
#     address involved is 127.0.0.1);
#   - builds a stand-in for the build-stage image FROM scratch with busybox, the
#     host's /usr/local/go and CA bundle, and uses `scratch` as the final base;
#   - vendors the modules into a temporary build context (never committed) and
#     builds with --network none, which proves the build needs no network;
#   - seeds the stand-in with a host build cache kept between runs, so a rerun
#     does not compile every dependency again (see step 3);
#   - tears everything down on exit (containers, dockerd, data root).
#
# Environment:
#   DEDUPGW_SKIP_DOCKER=1   skip locally; refused (exit 1) when CI=true.
#   DGW_DOCKER_SOCK         default /tmp/dgw-docker.sock
#   DGW_DOCKER_ROOT         default /tmp/dgw-docker-root (removed on exit)
#   DGW_SMOKE_GOCACHE       host build cache seeded into the stand-in image,
#                           kept between runs; default ~/.cache/dedupgw-docker-smoke/go-build
#   DGW_KEEP=1              keep dockerd and its data root running (debugging)
set -euo pipefail

t0=$(date +%s)
step_t=$t0
step() {
	local now
	now=$(date +%s)
	echo "docker-smoke: [+$((now - t0))s, step took $((now - step_t))s] $*"
	step_t=$now
}

if [[ "${DEDUPGW_SKIP_DOCKER:-}" == 1 ]]; then
	if [[ "${CI:-}" == true ]]; then
		echo "docker-smoke: DEDUPGW_SKIP_DOCKER=1 is not allowed when CI=true" >&2
		exit 1
	fi
	echo "docker-smoke: skipped (DEDUPGW_SKIP_DOCKER=1)"
	exit 0
fi

if [[ $(id -u) != 0 ]]; then
	echo "docker-smoke: must run as root (it starts dockerd)" >&2
	exit 1
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
sock=${DGW_DOCKER_SOCK:-/tmp/dgw-docker.sock}
root=${DGW_DOCKER_ROOT:-/tmp/dgw-docker-root}
exec_root=${root}-exec
gocache=${DGW_SMOKE_GOCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dedupgw-docker-smoke/go-build}
work=$(mktemp -d /tmp/dgw-smoke.XXXXXX)
image=dedupgw:smoke
standin=dgw-go-standin:local
container=dgw-smoke-$$
volume=dgw-smoke-data-$$
volume_uid=dgw-smoke-uid-$$
dockerd_pid=
upstream_pid=

# Debian's client matches Debian's daemon (and carries BuildKit support
# without the buildx plugin); a newer client elsewhere on PATH may not.
docker_bin=/usr/bin/docker
dk() { DOCKER_BUILDKIT=1 "$docker_bin" -H "unix://$sock" "$@"; }

# remove_roots unmounts whatever a dockerd left under its roots (overlay and
# shm mounts survive a killed daemon), then removes the roots.
remove_roots() {
	{ grep -oE " (${root}|${exec_root})[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done
	rm -rf "$root" "$exec_root" "$sock"
}

cleanup() {
	local rc=$?
	set +e
	if [[ -n $dockerd_pid ]] && [[ ${DGW_KEEP:-} != 1 ]]; then
		if [[ $rc != 0 ]]; then
			echo "docker-smoke: FAILED; container log:" >&2
			dk logs "$container" 2>&1 | tail -40 >&2
		fi
		dk rm -f "$container" >/dev/null 2>&1
		dk volume rm -f "$volume" "$volume_uid" >/dev/null 2>&1
		kill "$dockerd_pid" 2>/dev/null
		for _ in $(seq 1 100); do
			kill -0 "$dockerd_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$dockerd_pid" 2>/dev/null
		remove_roots
	fi
	if [[ -n $upstream_pid ]]; then
		kill "$upstream_pid" 2>/dev/null
		wait "$upstream_pid" 2>/dev/null
	fi
	rm -rf "$work"
	echo "docker-smoke: total $(($(date +%s) - t0))s, exit $rc"
	exit $rc
}
trap cleanup EXIT

# wait_for CMD... retries CMD every 0.2s for up to $WAIT_SECONDS (default 30).
wait_for() {
	local deadline=$(($(date +%s) + ${WAIT_SECONDS:-30}))
	until "$@" >/dev/null 2>&1; do
		if (($(date +%s) > deadline)); then
			echo "docker-smoke: timed out waiting for: $*" >&2
			return 1
		fi
		sleep 0.2
	done
}

# 1. Docker engine and a static busybox.
static_busybox() {
	command -v busybox >/dev/null && command -v file >/dev/null &&
		file -L "$(command -v busybox)" | grep -q 'statically linked'
}
if ! command -v dockerd >/dev/null || [[ ! -x $docker_bin ]] || ! static_busybox; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=300 update -q
	apt-get -o DPkg::Lock::Timeout=300 install -y -q docker.io busybox-static file
fi
busybox_bin=$(command -v busybox)
step "docker.io and busybox-static present ($("$docker_bin" --version))"

# 2. Our own dockerd: own socket, data root and exec root; no bridge, no
# iptables (neither is needed with host networking, and both need privileges
# or kernel modules a sandbox may lack).
if [[ -S $sock ]] && "$docker_bin" -H "unix://$sock" info >/dev/null 2>&1; then
	echo "docker-smoke: a dockerd already answers on $sock; stop it first" >&2
	exit 1
fi
remove_roots # a run that was killed may have left them
mkdir -p "$root" "$exec_root"
dockerd -H "unix://$sock" --data-root "$root" --exec-root "$exec_root" \
	--pidfile "$exec_root/dockerd.pid" --bridge=none --iptables=false --ip6tables=false \
	--ip-masq=false --userland-proxy=false >"$work/dockerd.log" 2>&1 &
dockerd_pid=$!
if ! WAIT_SECONDS=60 wait_for dk info; then
	tail -30 "$work/dockerd.log" >&2
	exit 1
fi
step "dockerd up (storage driver $(dk info --format '{{.Driver}}'))"

# 3. Build context: the work tree plus vendored modules (the build has no
# network). The same build runs on the host first, into a build cache kept
# between runs ($gocache): under -trimpath the compile cache does not depend
# on the source directory, so the stand-in image carries that cache and the
# build inside Docker mostly links. On a new machine the host build is the
# cold one, so the total stays the same; later runs take seconds.
mkdir -p "$work/ctx" "$gocache"
tar -C "$repo" --exclude=./.git --exclude=./vendor -cf - . | tar -C "$work/ctx" -xf -
(cd "$work/ctx" && GOFLAGS=-mod=mod go mod vendor)
(cd "$work/ctx" && GOCACHE=$gocache CGO_ENABLED=0 GOFLAGS="-mod=vendor -buildvcs=false" go build -trimpath -o /dev/null ./cmd/dedupgw)
step "build context ready, host build cache warm ($(du -sh "$gocache" | cut -f1) in $gocache)"

# 4. Stand-in for the build-stage image: busybox, the host's Go, the CA
# bundle and the warm build cache.
mkdir -p "$work/standin/go"
cp "$busybox_bin" "$work/standin/busybox"
cp /etc/ssl/certs/ca-certificates.crt "$work/standin/ca-certificates.crt"
goroot=$(go env GOROOT)
for d in bin pkg src lib go.env VERSION; do
	if [[ -e $goroot/$d ]]; then
		# Hard links are instant when /tmp and GOROOT share a file system.
		cp -al "$goroot/$d" "$work/standin/go/$d" 2>/dev/null || cp -a "$goroot/$d" "$work/standin/go/$d"
	fi
done
cp -al "$gocache" "$work/standin/go-build" 2>/dev/null || cp -a "$gocache" "$work/standin/go-build"
cat >"$work/standin/Dockerfile" <<'EOF'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN mkdir -p /tmp /root /etc/ssl/certs && chmod 1777 /tmp
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY go /usr/local/go
COPY go-build /root/.cache/go-build
ENV PATH=/usr/local/go/bin:/bin:/usr/bin HOME=/root GOPATH=/root/go \
    GOCACHE=/root/.cache/go-build GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-buildvcs=false
EOF
dk build --network none -q -t "$standin" "$work/standin" >/dev/null
rm -rf "$work/standin"
step "stand-in build image $standin built ($(dk run --rm --network none "$standin" go version))"

# 5. The project's Dockerfile, against the stand-in and a scratch final base.
version=$(cd "$repo" && git describe --tags --always --dirty 2>/dev/null || echo dev)
dk build --network none \
	--build-arg GO_IMAGE="$standin" \
	--build-arg BASE_IMAGE=scratch \
	--build-arg VERSION="$version" \
	-t "$image" "$work/ctx"
rm -rf "$work/ctx"
step "image $image built: $(dk image inspect -f '{{.Size}}' "$image") bytes, user $(dk image inspect -f '{{.Config.User}}' "$image")"

user=$(dk image inspect -f '{{.Config.User}}' "$image")
if [[ $user != 65532:65532 ]]; then
	echo "docker-smoke: image user is $user, want 65532:65532" >&2
	exit 1
fi
got_version=$(dk run --rm --network none "$image" version)
if [[ $got_version != *"$version"* ]]; then
	echo "docker-smoke: 'dedupgw version' printed '$got_version', want it to contain '$version'" >&2
	exit 1
fi
step "dedupgw version: $got_version"

# 6. A counting upstream on the host's loopback, and three free ports.
mkdir -p "$work/helper"
cat >"$work/helper/main.go" <<'EOF'
// Command helper is the docker smoke test's upstream: it counts the POSTs it
// receives and reports the count on GET /count. With "ports N" it prints N
// free loopback ports instead.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "ports" {
		n, _ := strconv.Atoi(os.Args[2])
		var ls []net.Listener
		for i := 0; i < n; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			ls = append(ls, l)
			fmt.Println(l.Addr().(*net.TCPAddr).Port)
		}
		for _, l := range ls {
			l.Close()
		}
		return
	}
	var posts atomic.Int64
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/count" {
			fmt.Fprint(w, posts.Load())
			return
		}
		io.Copy(io.Discard, r.Body)
		posts.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"received":true}`)
	})
	if err := http.ListenAndServe(os.Args[1], nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
EOF
(cd "$work/helper" && GOFLAGS=-buildvcs=false GO111MODULE=off go build -o helper main.go)
ports=($("$work/helper/helper" ports 3))
up_port=${ports[0]} gw_port=${ports[1]} admin_port=${ports[2]}
"$work/helper/helper" "127.0.0.1:$up_port" &
upstream_pid=$!
wait_for curl -fsS "http://127.0.0.1:$up_port/count"
step "upstream on 127.0.0.1:$up_port; gateway on :$gw_port, admin on :$admin_port"

# 7. Run the image as Kubernetes would: read-only root, no capabilities, no
# privilege escalation, the data directory on a volume; the baked default
# config, with ports and upstream from the environment.
dk volume create "$volume" >/dev/null
dk run -d --name "$container" --network host \
	--read-only --cap-drop ALL --security-opt no-new-privileges \
	-v "$volume:/var/lib/dedupgw" \
	-e "DEDUPGW_LISTEN=127.0.0.1:$gw_port" \
	-e "DEDUPGW_ADMIN_LISTEN=127.0.0.1:$admin_port" \
	-e "UPSTREAM_URL=http://127.0.0.1:$up_port" \
	"$image" >/dev/null
if ! wait_for curl -fsS "http://127.0.0.1:$admin_port/healthz"; then
	exit 1
fi
step "container healthy: /healthz answers"

fail() {
	echo "docker-smoke: $*" >&2
	exit 1
}
wait_for curl -fsS "http://127.0.0.1:$admin_port/readyz" || fail "/readyz never answered 2xx"

deliver() {
	curl -sS -o /dev/null -D - -X POST \
		-H 'Content-Type: application/json' -H 'Idempotency-Key: evt_smoke_1' \
		--data '{"id":"evt_smoke_1","type":"smoke.test"}' \
		"http://127.0.0.1:$gw_port/webhooks/smoke" | tr -d '\r'
}
first=$(deliver)
second=$(deliver)
first_status=$(sed -n 's/^[Dd]edup-[Ss]tatus: //p' <<<"$first")
second_status=$(sed -n 's/^[Dd]edup-[Ss]tatus: //p' <<<"$second")
first_code=$(head -1 <<<"$first" | awk '{print $2}')
second_code=$(head -1 <<<"$second" | awk '{print $2}')
count=$(curl -fsS "http://127.0.0.1:$up_port/count")
echo "docker-smoke: first delivery: $first_code $first_status; second: $second_code $second_status; upstream saw $count"
[[ $first_code == 200 && $first_status == forwarded ]] || fail "first delivery: got $first_code/$first_status, want 200/forwarded"
[[ $second_code == 200 && $second_status == duplicate ]] || fail "second delivery: got $second_code/$second_status, want 200/duplicate"
[[ $count == 1 ]] || fail "upstream received $count deliveries, want 1"
metrics=$(curl -fsS "http://127.0.0.1:$admin_port/metrics") || fail "/metrics did not answer 2xx"
grep -q '^dedupgw_deliveries_total{.*outcome="duplicate".*} 1$' <<<"$metrics" ||
	fail "/metrics: want dedupgw_deliveries_total with outcome=\"duplicate\" at 1; got: $(grep '^dedupgw_deliveries_total' <<<"$metrics")"
step "webhook delivered twice, forwarded once"

# 8. The bolt file survives a restart of the container (it lives on the volume).
dk restart -t 10 "$container" >/dev/null
wait_for curl -fsS "http://127.0.0.1:$admin_port/healthz" || fail "/healthz after restart"
third=$(deliver)
third_status=$(sed -n 's/^[Dd]edup-[Ss]tatus: //p' <<<"$third")
count=$(curl -fsS "http://127.0.0.1:$up_port/count")
[[ $third_status == duplicate && $count == 1 ]] || fail "after restart: got $third_status with $count upstream deliveries, want duplicate with 1"
step "after a container restart the key is still known (bolt on the volume)"

# 9. A platform that runs the image under a uid of its own in group 0
# (OpenShift's restricted policy) can write a fresh volume: the image's data
# directory is group 0 and group-writable. /readyz answers once the bolt
# file is open.
dk rm -f "$container" >/dev/null
dk volume create "$volume_uid" >/dev/null
dk run -d --name "$container" --network host --user 1000700000:0 \
	--read-only --cap-drop ALL --security-opt no-new-privileges \
	-v "$volume_uid:/var/lib/dedupgw" \
	-e "DEDUPGW_LISTEN=127.0.0.1:$gw_port" \
	-e "DEDUPGW_ADMIN_LISTEN=127.0.0.1:$admin_port" \
	-e "UPSTREAM_URL=http://127.0.0.1:$up_port" \
	"$image" >/dev/null
wait_for curl -fsS "http://127.0.0.1:$admin_port/readyz" ||
	fail "as uid 1000700000 in group 0 on a fresh volume: /readyz never answered 2xx (is the data directory writable?)"
step "as an arbitrary uid in group 0 on a fresh volume: the bolt file opens"

echo "docker-smoke: PASS"
