# syntax=docker/dockerfile:1
#
# The `plumber-processor` image: the step runtime. The daemon runs it three ways (SPEC §7):
#
# - jq and sql steps: this image alone;
# - http steps: this image beside the user's server image, in one pod;
# - exec steps: the user's image, with this binary copied in by an init container of this
#   image into a shared emptyDir:
#     command: ["/usr/local/bin/cp", "/plumber-processor", "/plumber/bin/plumber-processor"]
#   distroless has no shell and no cp, so the image carries busybox's static build under the
#   name `cp` (busybox acts as the applet it is called by) and nothing else of it. The
#   binary's path, /plumber-processor, is part of the image's contract.
#
# NOT BUILT HERE: the machine this was written on has no Docker, so this file has never been
# built or run. Build it from the repository root:
#
#   docker build -f deploy/docker/processor.Dockerfile -t plumber-processor:dev .
#
# What the binary links dynamically (ldd of a release build): glibc, libgcc_s, libssl3,
# libcrypto3 and zlib. distroless/cc has all but zlib, which is copied from the builder
# (both Debian 12). Copied into a user's exec image, the binary needs the same there: glibc
# 2.36 or newer, libssl3 and zlib (Debian 12 and Ubuntu 22.04 based images have them;
# Alpine's musl does not).

FROM rust:1-bookworm AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libssl-dev zlib1g-dev busybox-static \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p plumber-processor --bin plumber-processor \
    && arch="$(gcc -print-multiarch)" \
    && mkdir -p /out/usr/local/bin "/out/usr/lib/$arch" \
    && cp target/release/plumber-processor /out/plumber-processor \
    && cp -L "/usr/lib/$arch/libz.so.1" "/out/usr/lib/$arch/libz.so.1" \
    && cp /bin/busybox /out/usr/local/bin/cp

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ /
USER 65532:65532
ENTRYPOINT ["/plumber-processor"]
CMD ["--help"]
