"""Fixtures of the Kubernetes backend tests: the loopback S3 server (moto) for staging and fetching, an HTTP file
server (a delivery's source)."""

from _support.fixtures_servers import http_server, s3, s3_server  # noqa: F401  (pytest fixtures)
