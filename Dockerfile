# The one Tether image for real clusters: `tetherd` serves every role (`tetherd controller`,
# `tetherd gateway`, ...) chosen by the pod's arguments. Build from the repository root:
#   docker build -t ghcr.io/tether-dev/tetherd:v0.1.0 .

# Build stage: the toolchain of the workspace's rust-version, the locked dependencies.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tetherd \
    && install -D -m 0755 target/release/tetherd /out/tetherd

# Runtime stage: a small Debian with nftables, which the gateway role drives through `nft`.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates nftables \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin nonroot
COPY --from=build /out/tetherd /usr/local/bin/tetherd
# The controller runs as this user (the Deployment `tether install` renders says runAsUser
# 65532); roles that program the kernel get their capabilities from their pod spec.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tetherd"]
