"""helm: the triton-edge chart (helm/triton-edge/) and `tritonkit deploy`, which renders, checks and installs it."""
