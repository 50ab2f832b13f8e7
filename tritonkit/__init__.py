"""triton-edge-kit: one deploy.yaml in, tuned and verified Triton deployments out."""

__version__ = "0.1.0"
