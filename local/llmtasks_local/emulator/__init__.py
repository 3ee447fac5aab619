"""The local emulator: template.yaml's resources and event sources, without Docker or an AWS account."""
