"""The Helm chart (`triton-edge/`, shipped as package data) and the code that renders, checks and
installs it."""
