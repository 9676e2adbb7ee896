# Tandem container image for CPU workers and the coordinator: Debian 12,
# multi-stage. The build stage installs the build dependencies with
# deploy/install-deps.sh and compiles Release without CUDA; the runtime stage
# carries only the shared libraries and the three programs, and runs as the
# unprivileged user tandem (uid/gid 10001, as the Kubernetes manifests'
# runAsUser). Used by deploy/k8s (image tandem:latest, workers --device=cpu).
#   docker build -f deploy/docker/cpu.Dockerfile -t tandem:latest .
#   docker run --rm tandem:latest --help
# Binaries built elsewhere (same Debian 12 libraries, CUDA off): put
# tandem-coordinator, tandem-worker and tandemctl in prebuilt/ of the build
# context and pass --build-arg BINARIES=prebuilt (tests/deploy/container_test.sh
# does, with deploy/install-deps.sh and configs/ beside them).
# The CUDA image is deploy/docker/cuda.Dockerfile.

ARG BASE=debian:12

FROM ${BASE} AS build
# build: compile here; prebuilt: take the programs from prebuilt/ in the context.
ARG BINARIES=build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN if [ "$BINARIES" = build ]; then ./deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*; fi
COPY . .
RUN mkdir -p /out/bin \
 && if [ "$BINARIES" = prebuilt ]; then \
      cp prebuilt/tandem-coordinator prebuilt/tandem-worker prebuilt/tandemctl /out/bin/; \
    else \
      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_TESTS=OFF \
        -DTANDEM_BUILD_BENCH=OFF -DTANDEM_ENABLE_CUDA=OFF \
      && cmake --build build -j"$(nproc)" --target tandem-coordinator tandem-worker tandemctl \
      && cp build/bin/tandem-coordinator build/bin/tandem-worker build/bin/tandemctl /out/bin/; \
    fi

FROM ${BASE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# Runtime libraries only (the -dev packages of the build stage pull these in).
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 libspdlog1.10 libfmt9 libopenblas0-pthread \
      libgloo0 libsqlite3-0 libgomp1 libabsl20220623 libxxhash0 libpcre2-8-0 libicu72 \
      ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 tandem \
 && useradd --uid 10001 --gid tandem --home-dir /var/lib/tandem \
      --create-home --shell /usr/sbin/nologin tandem
COPY --from=build /out/bin/ /usr/local/bin/
COPY configs/ /etc/tandem/
# Every library the programs need is here: fail the build otherwise.
RUN ! ldd /usr/local/bin/tandem-coordinator /usr/local/bin/tandem-worker /usr/local/bin/tandemctl \
      | grep "not found"
USER 10001:10001
WORKDIR /var/lib/tandem
# gRPC and metrics/health ports of the coordinator.
EXPOSE 7070 9090
VOLUME ["/var/lib/tandem"]
ENTRYPOINT ["/usr/local/bin/tandem-coordinator"]
# Plaintext inside the container network (--insecure); mount a certificate
# and pass --tls-cert/--tls-key instead where that network is not trusted.
CMD ["--listen", "0.0.0.0:7070", "--insecure", "--metrics-listen", "0.0.0.0:9090", "--state-dir", "/var/lib/tandem/state"]
