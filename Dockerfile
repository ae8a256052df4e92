# The one image of Stoke on Kubernetes: the controller, the gateway and the
# runtime Pods (runtime-server and runtimed) all run it. stoke plus bash
# and python3, the Runtimes' interpreters, and git, with which runtimed
# fetches a Run's spec.source.git; nothing else.
#   docker build -t stoke .
# Not built in this repository's CI: the build machines have no container
# engine and no registry (deploy/helm/stoke/README.md).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/stoke ./cmd/stoke \
 && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/stoke-lambda-bootstrap ./cmd/stoke-lambda-bootstrap

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash python3 ca-certificates git \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/stoke /usr/local/bin/stoke
# What a lambda Runtime's Pods package into their functions: found beside stoke.
COPY --from=build /out/stoke-lambda-bootstrap /usr/local/bin/stoke-lambda-bootstrap
# The chart's Pods run as 65532 (runAsNonRoot, readOnlyRootFilesystem);
# the image says so too.
USER 65532:65532
ENTRYPOINT ["stoke"]
