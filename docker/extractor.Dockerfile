# specwire-extractor on a CUDA base: hidden states and greedy completions of a Hugging Face
# checkpoint on one or more GPUs (or the CPU). From the repository root:
#
#   docker build -f docker/extractor.Dockerfile -t specwire-extractor .
#   docker run --gpus all -v "$PWD/models:/models:ro" -p 127.0.0.1:50051:50051 \
#     specwire-extractor --model=/models/tiny-qwen3 --device_map=cuda --listen=0.0.0.0:50051
#
# A CPU image is the same build on a plain base, without the CUDA backend (the CMD below then
# needs --device_map=cpu, as deploy/docker-compose.yml's extractor-cpu service passes):
#
#   docker build -f docker/extractor.Dockerfile --build-arg BUILD_BASE=debian:12 \
#     --build-arg RUNTIME_BASE=debian:12 --build-arg SPECWIRE_CUDA=OFF -t specwire-extractor:cpu .
#
# Stage "build" mirrors scripts/setup.sh: the same Debian/Ubuntu dev packages (Ubuntu 24.04 ships
# the gRPC 1.51 / absl 20220623 / protobuf 3.21 of Debian 12), libtorch from the pinned torch
# wheel (requirements.txt + constraints.txt; PyPI's Linux wheel is the CUDA build that
# cmake/Torch.cmake consumes), and the same CMake configure, with SPECWIRE_CUDA=ON and only the
# service binaries built. Stage "runtime" gets the binaries, the system libraries they link
# (collected with ldd) and, for CUDA, the wheel's torch/lib + nvidia/ libraries at the path the
# binaries' RPATH names; a CPU image gets only the torch libraries the binaries load (no CUDA
# kernels).
# The wheel brings its own CUDA runtime; any CUDA 13 base with a driver that supports the wheel's
# CUDA version works (CUDA_VERSION selects the base image).
# BuildKit is required (the cache mounts keep pip's downloads and ccache's objects between
# builds); only the Dockerfile syntax built into BuildKit is used, so no frontend image is pulled.
ARG CUDA_VERSION=13.0.0
ARG BASE_OS=ubuntu24.04
ARG BUILD_BASE=nvidia/cuda:${CUDA_VERSION}-devel-${BASE_OS}
ARG RUNTIME_BASE=nvidia/cuda:${CUDA_VERSION}-runtime-${BASE_OS}

FROM ${BUILD_BASE} AS build
# ON: link the CUDA backend (the image runs on GPUs and CPUs); OFF: a CPU-only image.
ARG SPECWIRE_CUDA=ON
ARG DEBIAN_FRONTEND=noninteractive
# scripts/setup.sh's APT_PACKAGES minus the test-only tools (gtest/benchmark are kept: CMake
# looks for them when tests are on; they cost little).
# Distribution packages are left to the base image's release (hadolint DL3008).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build ccache pkg-config git ca-certificates \
      python3 python3-venv python3-dev \
      libabsl-dev nlohmann-json3-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      prometheus-cpp-dev libpcre2-dev libutf8proc-dev libsqlite3-dev \
    && rm -rf /var/lib/apt/lists/*

# libtorch: the torch wheel installed into /opt/torch (its torch/ and nvidia/ folders side by
# side, as in site-packages, so torch's own RPATH to ../../nvidia/* holds).
COPY requirements.txt constraints.txt /src/
RUN --mount=type=cache,id=specwire-pip,target=/root/.cache/pip \
    python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --target /opt/torch -c /src/constraints.txt \
         "$(grep -E '^torch==' /src/requirements.txt)" \
    && test -f /opt/torch/torch/include/ATen/ATen.h && test -f /opt/torch/torch/lib/libtorch_cuda.so

COPY . /src
WORKDIR /src
ENV CCACHE_DIR=/root/.cache/ccache
# /opt/ship holds what the runtime stage copies to /opt/torch: with CUDA the wheel's torch/lib and
# nvidia/ whole (libtorch_cuda finds its CUDA libraries through its own RPATH); without, nothing
# (collect-libs.sh then copies the torch libraries the binaries load into /opt/specwire/lib).
RUN --mount=type=cache,id=specwire-ccache,target=/root/.cache/ccache \
    cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECWIRE_TESTS=OFF \
      -DSPECWIRE_CUDA=${SPECWIRE_CUDA} -DSPECWIRE_TORCH_DIR=/opt/torch/torch \
      -DPython3_EXECUTABLE=/opt/venv/bin/python \
    && cmake --build /build --target specwire-extractor specwire-extract specwire-cli \
    && mkdir -p /opt/specwire/bin /opt/specwire/lib /opt/ship/torch/lib /opt/ship/nvidia \
    && cp /build/services/extractor/specwire-extractor /build/services/extractor/specwire-extract \
          /build/clients/cli/specwire-cli /opt/specwire/bin/ \
    && if [ "${SPECWIRE_CUDA}" = ON ]; then \
         sh docker/collect-libs.sh /opt/specwire/lib --skip /opt/torch /opt/specwire/bin/* \
         && mv /opt/torch/torch/lib/* /opt/ship/torch/lib/ && mv /opt/torch/nvidia/* /opt/ship/nvidia/; \
       else \
         sh docker/collect-libs.sh /opt/specwire/lib /opt/specwire/bin/*; \
       fi

FROM ${RUNTIME_BASE} AS runtime
COPY --from=build /opt/ship /opt/torch
COPY --from=build /opt/specwire /opt/specwire
RUN echo /opt/specwire/lib > /etc/ld.so.conf.d/specwire.conf && ldconfig \
    && groupadd --system --gid 10001 specwire \
    && useradd --system --uid 10001 --gid specwire --home-dir /home/specwire --create-home \
         --shell /usr/sbin/nologin specwire \
    && mkdir -p /models \
    && ldd /opt/specwire/bin/* > /tmp/ldd.txt && ! grep "not found" /tmp/ldd.txt && rm /tmp/ldd.txt
ENV PATH=/opt/specwire/bin:${PATH}
USER 10001:10001
WORKDIR /home/specwire
# Checkpoints are mounted here (read-only is enough).
VOLUME ["/models"]
# gRPC, Prometheus metrics.
EXPOSE 50051 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
  CMD ["specwire-cli", "health", "--extractor", "127.0.0.1:50051", "--service", "specwire.v1.Extractor", "--extractor_timeout", "4"]
ENTRYPOINT ["specwire-extractor"]
CMD ["--model=/models/tiny-qwen3", "--dtype=bfloat16", "--device_map=cuda", \
     "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]
