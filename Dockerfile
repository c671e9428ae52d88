# dedupq: a multi-stage build. docker-compose.yml and deploy/kubernetes/ use it.
#
#   docker build --build-arg DEDUPQ_GIT_COMMIT=$(git rev-parse --short HEAD) -t dedupq:0.1.0 .
#   docker build --build-arg FEATURES=gssapi -t dedupq:0.1.0-gssapi .   # Kerberos for Kafka
#
# DEDUPQ_GIT_COMMIT is the `commit` label of dedupq_build_info (the build
# context has no .git to read it from; without it the label says unknown).
ARG RUST_VERSION=1.95.0
ARG DEBIAN=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN} AS builder
ARG FEATURES=""
# librdkafka is built from source against the system OpenSSL (TLS, SASL
# SCRAM); Kerberos (the gssapi feature) also needs the Cyrus SASL headers.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl-dev pkg-config libsasl2-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# Dependency layer: built from the manifests alone, so a change to dedupq's
# own code does not rebuild librdkafka and the rest. Every workspace member's
# manifest is needed (cargo loads the whole workspace); the lab is never
# built here, its sources stay stubs.
COPY Cargo.toml Cargo.lock ./
COPY lab/Cargo.toml lab/
COPY provider/Cargo.toml provider/
RUN for dir in . lab provider; do \
        mkdir -p $dir/src && echo 'fn main() {}' >$dir/src/main.rs && touch $dir/src/lib.rs; \
    done \
    && cargo build --release --locked --features "${FEATURES}" -p dedupq -p dedupq-provider --bins \
    && rm -rf src provider/src target/release/.fingerprint/dedupq-* target/release/deps/*dedupq*

# The service and the provider simulator (docker-compose.yml runs it).
# The commit is declared here, after the dependency layer, so that a new
# commit does not rebuild the dependencies.
ARG DEDUPQ_GIT_COMMIT=""
COPY build.rs ./
COPY src src
COPY migrations migrations
COPY provider/src provider/src
RUN cargo build --release --locked --features "${FEATURES}" -p dedupq -p dedupq-provider --bins \
    && cp target/release/dedupq target/release/dedupq-provider /usr/local/bin/

FROM debian:${DEBIAN}-slim
# libssl3: librdkafka's TLS; libsasl2-2: Kerberos builds; ca-certificates:
# public CAs for managed Kafka, RabbitMQ and PostgreSQL.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 libsasl2-2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /usr/local/bin/dedupq /usr/local/bin/dedupq-provider /usr/local/bin/
# A numeric user, so Kubernetes can check runAsNonRoot without a passwd file.
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["dedupq"]
CMD ["run"]
