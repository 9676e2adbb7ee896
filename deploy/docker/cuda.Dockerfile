# Tandem container image for GPU workers: built on NVIDIA's CUDA images
# (the toolkit's devel image to compile, its runtime image, which carries
# cudart, cuBLAS and NCCL, to run). The build stage installs the build
# dependencies with deploy/install-deps.sh and NCCL's headers and compiles
# Release with CUDA (sm_90 and PTX; override with
# --build-arg CUDA_ARCHITECTURES=...). The runtime stage adds the shared
# libraries the programs need beyond the CUDA ones (found with ldd in the
# build stage) and runs as the unprivileged user tandem (uid/gid 10001, as the
# Kubernetes manifests' runAsUser). Used by deploy/k8s/cuda (image
# tandem-cuda:latest, workers --device=cuda, one nvidia.com/gpu each); the
# host needs the NVIDIA driver and container toolkit.
#   docker build -f deploy/docker/cuda.Dockerfile -t tandem-cuda:latest .
#   docker run --rm --gpus all tandem-cuda:latest --help
# CUDA_VERSION and UBUNTU pick the nvidia/cuda tags (Tandem's libraries
# come from the distribution: gRPC 1.51, Protobuf 3.21 and Abseil 20220623
# are in Ubuntu 24.04 as in Debian 12).

ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ARG CUDA_ARCHITECTURES=90
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN apt-get update -q \
 && ./deploy/install-deps.sh \
 && apt-get install -y -q --no-install-recommends libnccl-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_TESTS=OFF \
      -DTANDEM_BUILD_BENCH=OFF -DTANDEM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build build -j"$(nproc)" --target tandem-coordinator tandem-worker tandemctl \
 && mkdir -p /out/bin /out/lib \
 && cp build/bin/tandem-coordinator build/bin/tandem-worker build/bin/tandemctl /out/bin/ \
 && ldd /out/bin/tandem-worker | grep -q "libnccl.so" \
 && ldd /out/bin/tandem-worker | grep -q "libcudart.so" \
 && ldd /out/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u \
    | grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so' \
    | grep -Ev '/(libcudart|libcublas|libcublasLt|libnccl|libcuda)\.so' \
    | xargs -r cp -L -t /out/lib/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 tandem \
 && useradd --uid 10001 --gid tandem --home-dir /var/lib/tandem \
      --create-home --shell /usr/sbin/nologin tandem
COPY --from=build /out/lib/ /usr/local/lib/tandem/
COPY --from=build /out/bin/ /usr/local/bin/
COPY configs/ /etc/tandem/
# NCCL comes with the runtime image; every library is found: fail the build otherwise.
RUN echo /usr/local/lib/tandem >/etc/ld.so.conf.d/tandem.conf && ldconfig \
 && ldconfig -p | grep -q "libnccl.so.2" \
 && ! ldd /usr/local/bin/tandem-coordinator /usr/local/bin/tandem-worker /usr/local/bin/tandemctl \
      | grep "not found"
USER 10001:10001
WORKDIR /var/lib/tandem
# A worker listens on no fixed port (collectives use ephemeral ports).
ENTRYPOINT ["/usr/local/bin/tandem-worker"]
CMD ["--help"]
