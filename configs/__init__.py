"""configs: deploy.yaml -> model_repository/<model>/config.pbtxt through Triton's own schema."""
