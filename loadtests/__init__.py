"""loadtests: Locust load tests and sweeps against a running Triton, with exact percentiles."""
