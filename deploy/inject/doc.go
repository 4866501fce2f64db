// Package inject adds timing-sidecar to the pods of Kubernetes manifests
// that run an LLM engine, as a service mesh's injector adds its proxy:
// whatever rendered them (a Helm chart through a post-renderer, kustomize,
// kubectl get), it reads the documents, finds each pod spec that runs an
// engine, moves the engine to a free port and gives the engine's port to
// the sidecar, so the Services, routers, probes and scrapes that reached
// the engine reach the sidecar, which relays to it. Everything else is
// written back as it came: kyaml keeps field order and comments.
package inject
