"""Machine-facing HTTP endpoints (pod-to-pod internal calls and the lease protocol)."""
