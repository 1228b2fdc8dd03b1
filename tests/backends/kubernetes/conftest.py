"""Fixtures of the Kubernetes backend tests: the loopback S3 server (moto) for staging and fetching."""

from _support.fixtures_servers import s3, s3_server  # noqa: F401  (pytest fixtures)
