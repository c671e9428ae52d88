# dedupq: a multi-stage build. `docker compose up` (docker-compose.yml) uses it.
FROM rust:1-bookworm AS builder
# rdkafka builds librdkafka from source with CMake.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --bin dedupq \
    && cp target/release/dedupq /usr/local/bin/dedupq

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --shell /usr/sbin/nologin dedupq
COPY --from=builder /usr/local/bin/dedupq /usr/local/bin/dedupq
USER dedupq
ENTRYPOINT ["dedupq"]
CMD ["run"]
