"""Observing the running job: Prometheus metrics, health, the HTTP endpoint and server, progress
lines. The job and the dashboard both use it; it imports neither."""
