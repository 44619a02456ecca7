# syntax=docker/dockerfile:1
# outboxd's container image: `docker build -t outboxd:0.2.0 .`
#
# Images cannot be pulled on this project's own machines (no registry for base images, no
# Docker daemon), so CI does not build this file. Its build step is the command the project
# already builds its release binary with (bench/run.py: `cargo build --release --bin outboxd`),
# plus --locked so that the image uses exactly Cargo.lock, from the same sources CI tests
# (`cargo test` in .ci/run). Keep it that way: the image holds what was tested and measured.

# The toolchain CI uses (rustc 1.95; Cargo.toml needs 1.94 or later), on Debian 12 like the
# runtime below, so the binary links against the same glibc.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# Only what the build reads (.dockerignore lets nothing else in): the templates and the
# migrations are compiled into the binary.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY producer ./producer
COPY templates ./templates
COPY migrations ./migrations
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin outboxd \
    && install -D -m 0755 target/release/outboxd /out/outboxd

# glibc and libgcc, CA certificates and a `nonroot` user (65532): no shell, no package manager.
# outboxd trusts its own bundled TLS roots (webpki-roots), plus OUTBOXD_SMTP_CA_FILE if set.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/outboxd /usr/local/bin/outboxd
# A numeric user, so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# OUTBOXD_LISTEN's default: /metrics, /livez, /readyz. The admin surface is on it too unless
# OUTBOXD_ADMIN_LISTEN moves it (deploy/ uses 9899).
EXPOSE 9898
ENTRYPOINT ["/usr/local/bin/outboxd"]
# `outboxd migrate` for the migration Job or an init container; `run` by default.
CMD ["run"]
