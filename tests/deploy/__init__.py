"""The image, its container and the Kubernetes manifests (docs/deployment.md)."""
