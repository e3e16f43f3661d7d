"""The Dagster composer resource refuses a shop's template as `digest sweep` does: its one line is
the cause of the resource's failure, so the step that needs it (the week's first) stops before
it records anything."""

from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline.component.resources import ComposerResource
from digest_pipeline.domain.model import WorkItem
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import InvalidSetting
from digest_pipeline_tests.builders import digest_rows_for, email_of, key_of
from digest_pipeline_tests.conftest import T0


def test_a_template_without_the_unsubscribe_link_fails_the_composer_resource(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "digest.txt.j2").write_text("{{ postal_address }}\n", encoding="utf-8")
    monkeypatch.setenv("DIGEST_TEMPLATE_DIR", str(tmp_path))

    with (
        pytest.raises(dg.DagsterResourceFunctionError) as failed,
        dg.build_resources({"composer": ComposerResource()}),
    ):
        pass

    cause = failed.value.__cause__
    assert isinstance(cause, InvalidSetting)
    assert str(cause) == (
        f"DIGEST_TEMPLATE_DIR: {tmp_path / 'digest.txt.j2'} renders no unsubscribe link: "
        "output {{ unsubscribe_url }}"
    )


def test_the_composer_resource_uses_the_shops_brand(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DIGEST_SHOP_NAME", "Tea & Kettle")
    key = key_of(1)

    with dg.build_resources({"composer": ComposerResource()}) as resources:
        message = resources.composer.compose(
            WorkItem(key, DeliveryState.CLAIMED, T0, None), email_of(1), digest_rows_for(key, 2)
        )

    assert "Tea & Kettle" in message.subject
    assert "Tea &amp; Kettle" in (message.html or "")
