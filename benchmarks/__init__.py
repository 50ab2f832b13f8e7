"""Benchmarks: the kit measured against its peers and against itself (`tritonkit bench`, `make bench`).

Nothing here is imported by a product stage: these modules compare, they do not serve or tune."""
