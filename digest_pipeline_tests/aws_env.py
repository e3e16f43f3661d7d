"""Tests that build boto3 clients see no AWS variable or file of the developer's, only their own."""

import os

import pytest

from digest_pipeline.rigs.servers.ses_server import HERMETIC_AWS


def isolate_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drops every `AWS_*` variable and points boto3's files and metadata lookups at nothing."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in HERMETIC_AWS.items():
        monkeypatch.setenv(name, value)
