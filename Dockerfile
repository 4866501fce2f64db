# syntax=docker/dockerfile:1
# timing-sidecar: a static binary on distroless, running as non-root.
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t timing-sidecar .

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# The same script the e2e tests build with.
RUN VERSION="$VERSION" COMMIT="$COMMIT" .ci/build /out/timing-sidecar

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/timing-sidecar /timing-sidecar
# distroless nonroot, as numbers: the kubelet can verify runAsNonRoot
# only for a numeric user.
USER 65532:65532
# Proxy (clients) and admin (/metrics, /healthz, /readyz).
EXPOSE 8001 9101
ENTRYPOINT ["/timing-sidecar"]
