"""Helpers the tests share: real servers on 127.0.0.1 (S3, OCI, HTTP), the Kubernetes pod executor."""
