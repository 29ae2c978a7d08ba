// Package deploy holds the tests of parity's deployment files: the systemd unit
// (deploy/systemd), the Kubernetes manifests (deploy/k8s), the container build file
// (deploy/container) and the release binaries (make release). It is its own module so
// the Kubernetes API types it decodes the manifests into stay out of the product's
// go.mod; `make test` runs it.
package deploy
