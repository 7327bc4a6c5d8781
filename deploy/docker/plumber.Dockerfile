# syntax=docker/dockerfile:1
#
# The `plumber` image: the in-cluster daemon (`plumber daemon --config FILE`, deploy/) and
# the CLI (`plumber render`, `plumber crd`, ...).
#
# NOT BUILT HERE: the machine this was written on has no Docker, so this file has never been
# built or run. Build it from the repository root:
#
#   docker build -f deploy/docker/plumber.Dockerfile -t plumber:dev .
#
# What the binary links dynamically (ldd of a release build): glibc, libgcc_s, libssl3 and
# libcrypto3 (rdkafka's TLS, libgit2's https, the Kubernetes client), zlib (rdkafka,
# libssh2). libgit2 and libssh2 are built in (vendored). distroless/cc has all but zlib,
# which is copied from the builder: both are Debian 12, so the versions match.

FROM rust:1-bookworm AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches keep crates and build artefacts between builds; the binary leaves the cached
# target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p plumber --bin plumber \
    && arch="$(gcc -print-multiarch)" \
    && mkdir -p /out/usr/local/bin "/out/usr/lib/$arch" \
    && cp target/release/plumber /out/usr/local/bin/plumber \
    && cp -L "/usr/lib/$arch/libz.so.1" "/out/usr/lib/$arch/libz.so.1"

# Non-root (uid 65532), no shell, no package manager; CA certificates included.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/plumber"]
CMD ["--help"]
