# specwire-scorer (CPU): runs DFlash drafters against the target that extractors serve, and
# specwire-score, the job client. From the repository root:
#
#   docker build -f docker/scorer.Dockerfile -t specwire-scorer .
#   docker run -v "$PWD/models:/models:ro" -p 127.0.0.1:50061:50061 specwire-scorer \
#     --extractor=dns:///extractor:50051 --listen=0.0.0.0:50061 --data_root=/models
#
# The drafter is small next to the target, so this image runs it on the CPU and stays free of
# CUDA: the build stage mirrors scripts/setup.sh (same dev packages and CMake configure) and
# takes libtorch from the pinned torch wheel; the runtime stage gets only the libraries the
# binaries load (libtorch_cpu, libc10 and what they link, collected with ldd), not the wheel's
# CUDA kernels. For a drafter on a GPU, build the binaries as in docker/extractor.Dockerfile.
# BASE_IMAGE: any Ubuntu 24.04 or Debian 12 image (both stages use it; both releases ship the same
# gRPC / absl / protobuf). BuildKit is required (the cache mounts keep pip's downloads and ccache's
# objects between builds); only the Dockerfile syntax built into BuildKit is used, so no frontend
# image is pulled.
ARG BASE_IMAGE=ubuntu:24.04

FROM ${BASE_IMAGE} AS build
ARG DEBIAN_FRONTEND=noninteractive
# Distribution packages are left to the base image's release (hadolint DL3008).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build ccache pkg-config git ca-certificates \
      python3 python3-venv python3-dev \
      libabsl-dev nlohmann-json3-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      prometheus-cpp-dev libpcre2-dev libutf8proc-dev libsqlite3-dev \
    && rm -rf /var/lib/apt/lists/*

COPY requirements.txt constraints.txt /src/
RUN --mount=type=cache,id=specwire-pip,target=/root/.cache/pip \
    python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --target /opt/torch -c /src/constraints.txt \
         "$(grep -E '^torch==' /src/requirements.txt)" \
    && test -f /opt/torch/torch/include/ATen/ATen.h

COPY . /src
WORKDIR /src
ENV CCACHE_DIR=/root/.cache/ccache
RUN --mount=type=cache,id=specwire-ccache,target=/root/.cache/ccache \
    cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECWIRE_TESTS=OFF \
      -DSPECWIRE_TORCH_DIR=/opt/torch/torch -DPython3_EXECUTABLE=/opt/venv/bin/python \
    && cmake --build /build --target specwire-scorer specwire-score specwire-cli \
    && mkdir -p /opt/specwire/bin /opt/specwire/lib \
    && cp /build/services/scorer/specwire-scorer /build/services/scorer/specwire-score \
          /build/clients/cli/specwire-cli /opt/specwire/bin/ \
    && sh docker/collect-libs.sh /opt/specwire/lib /opt/specwire/bin/*

FROM ${BASE_IMAGE} AS runtime
COPY --from=build /opt/specwire /opt/specwire
RUN echo /opt/specwire/lib > /etc/ld.so.conf.d/specwire.conf && ldconfig \
    && ldd /opt/specwire/bin/* > /tmp/ldd.txt && ! grep "not found" /tmp/ldd.txt && rm /tmp/ldd.txt \
    && groupadd --system --gid 10001 specwire \
    && useradd --system --uid 10001 --gid specwire --home-dir /home/specwire --create-home \
         --shell /usr/sbin/nologin specwire \
    && mkdir -p /models /var/cache/specwire && chown specwire:specwire /var/cache/specwire
ENV PATH=/opt/specwire/bin:${PATH}
USER 10001:10001
WORKDIR /home/specwire
# Drafters and datasets (read-only is enough); the target-head cache and results.
VOLUME ["/models", "/var/cache/specwire"]
# gRPC, Prometheus metrics.
EXPOSE 50061 9465
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["specwire-cli", "health", "--scorer", "127.0.0.1:50061", "--service", "specwire.v1.Scorer", "--scorer_timeout", "4"]
ENTRYPOINT ["specwire-scorer"]
CMD ["--extractor=dns:///extractor:50051", "--listen=0.0.0.0:50061", \
     "--metrics_listen=0.0.0.0:9465", "--data_root=/models", "--cache_dir=/var/cache/specwire"]
