"""Powertools Logger, Metrics and Tracer with the service's defaults (env vars still override them)."""
import os

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "hotledger")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Hotledger")


def logger() -> Logger:
    return Logger(service=SERVICE)


def metrics() -> Metrics:
    return Metrics(namespace=NAMESPACE, service=SERVICE)


def tracer() -> Tracer:
    """X-Ray (the template turns Tracing on); disabled outside Lambda and under `sam local`."""
    return Tracer(service=SERVICE)
