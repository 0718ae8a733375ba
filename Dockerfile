# dedupgw container image.
#
# Two stages: a Go toolchain image builds a static binary; a minimal base image
# runs it as a non-root numeric user. Both base images are build arguments, so
# an air-gapped build can point them at local images:
#
#   docker build -t dedupgw .
#   docker build --build-arg GO_IMAGE=registry.local/golang:1.26 \
#                --build-arg BASE_IMAGE=scratch -t dedupgw .
#
# The build needs the module sources. Online, `go mod download` fetches them.
# Offline, put a vendor/ directory in the build context (`go mod vendor`; not
# committed) and it is used instead: .ci/docker-smoke.sh does exactly that.
#
# No "# syntax=" line on purpose: it would make BuildKit pull a frontend image.

ARG GO_IMAGE=golang:1.26
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0
COPY . .
ARG VERSION=dev
RUN set -e; \
    if [ -f vendor/modules.txt ]; then export GOFLAGS=-mod=vendor; else go mod download; fi; \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/usr/local/bin/dedupgw ./cmd/dedupgw; \
    /out/usr/local/bin/dedupgw version; \
    mkdir -p /out/etc/dedupgw /out/etc/ssl/certs /out/var/lib/dedupgw; \
    chmod 0770 /out/var/lib/dedupgw; \
    cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt; \
    printf '%s\n' \
      '# Default dedupgw configuration baked into the image.' \
      '# Mount a directory with your own config.yaml over /etc/dedupgw (a file' \
      '# mounted alone never sees edits), or keep this one and' \
      '# set UPSTREAM_URL: every POST is deduplicated by its Idempotency-Key or' \
      '# Webhook-Id header, else by the SHA-256 of its (canonical JSON) body.' \
      'listen: ":8080"' \
      'admin:' \
      '  # Probes reach the admin port from outside the container. Set' \
      '  # DEDUPGW_ADMIN_TOKEN to guard /v1/keys when the port is reachable.' \
      '  listen: ":9090"' \
      '  insecure: true' \
      'log:' \
      '  level: info' \
      '  format: json' \
      'store:' \
      '  backend: bolt' \
      '  bolt:' \
      '    # /var/lib/dedupgw is a volume: mount one that outlives the container.' \
      '    path: /var/lib/dedupgw/dedupgw.db' \
      'routes:' \
      '  - name: default' \
      '    path: "/*"' \
      '    upstream: "${UPSTREAM_URL}"' \
      '    provider: generic' \
      '    keys: ["header:Idempotency-Key", "header:Webhook-Id", "body"]' \
      > /out/etc/dedupgw/config.yaml

FROM ${BASE_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="dedupgw" \
      org.opencontainers.image.description="Webhook deduplication gateway" \
      org.opencontainers.image.source="https://github.com/dedupgw/dedupgw" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/etc/dedupgw/config.yaml /etc/dedupgw/config.yaml
# The data directory belongs to the image's user and to group 0, writable by
# both: a platform that runs the image under a uid of its own choosing in
# group 0 (OpenShift's restricted policy) can still write the bolt file.
# COPY of a directory copies what is in it, so the parent is copied to keep
# the directory's own mode (0770).
COPY --from=build --chown=65532:0 /out/var/lib /var/lib
COPY --from=build /out/usr/local/bin/dedupgw /usr/local/bin/dedupgw
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
VOLUME ["/var/lib/dedupgw"]
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/dedupgw"]
CMD ["serve", "--config", "/etc/dedupgw/config.yaml"]
