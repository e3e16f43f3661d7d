"""A shop's templates and picks rule are checked at start: a bad one is one line, exit 2, and
nothing recorded, as any other bad setting is.

The picks rule is read with the settings, so every command refuses an import path that does not
load before anything is recorded. The templates are checked when the composer is built, which
`digest sweep` and `digest run` do before any record, the secret's first fingerprint included.
"""

from pathlib import Path

import pytest

from digest_pipeline.domain.fingerprints import UNSUBSCRIBE

PACKAGE_TEMPLATES = Path(__file__).resolve().parents[2] / "digest_pipeline" / "templates"


def _one_line(run, command: str) -> str:
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert run.err.startswith(f"digest {command}: error: ")
    return str(run.err)


def _delivery_records(world) -> dict[str, list[tuple[object, ...]]]:
    """Every table of the ledger, the secret fingerprints included."""
    return dict(world.dump())


def _without(tmp_path: Path, name: str, variable: str) -> Path:
    """A template directory whose `name` is the package's without `{{ variable }}`."""
    folder = tmp_path / "look"
    folder.mkdir()
    text = (PACKAGE_TEMPLATES / name).read_text(encoding="utf-8")
    (folder / name).write_text(text.replace("{{ " + variable + " }}", ""), encoding="utf-8")
    return folder


@pytest.mark.parametrize("argv", [["sweep"], ["run", "--period", "2026-W42"]], ids=lambda a: a[0])
@pytest.mark.parametrize(
    ("name", "variable", "says"),
    [
        ("digest.txt.j2", "unsubscribe_url", "renders no unsubscribe link"),
        ("digest.html.j2", "postal_address", "renders no postal address"),
    ],
)
def test_a_template_missing_the_link_or_footer_changes_nothing(
    mixed, tmp_path, name, variable, says, argv
):
    folder = _without(tmp_path, name, variable)
    before, mail = _delivery_records(mixed), mixed.outbox_files()

    run = mixed.cli(*argv, env={"DIGEST_TEMPLATE_DIR": str(folder)})
    line = _one_line(run, argv[0])

    assert f"DIGEST_TEMPLATE_DIR: {folder / name} {says}" in line
    assert _delivery_records(mixed) == before
    assert mixed.outbox_files() == mail


def test_a_sweep_with_a_template_that_does_not_parse_changes_nothing(mixed, tmp_path):
    folder = tmp_path / "look"
    folder.mkdir()
    (folder / "pick.txt.j2").write_text("{% for %}", encoding="utf-8")
    before = _delivery_records(mixed)

    line = _one_line(mixed.cli("sweep", env={"DIGEST_TEMPLATE_DIR": str(folder)}), "sweep")

    assert f"{folder / 'pick.txt.j2'} line 1: " in line
    assert _delivery_records(mixed) == before


@pytest.mark.parametrize(
    "argv",
    [["status", "--period", "2026-W42"], ["sweep"], ["run", "--period", "2026-W42"]],
    ids=lambda a: a[0],
)
def test_a_picks_rule_that_does_not_import_is_refused_by_every_command(mixed, argv):
    before, mail = mixed.dump(), mixed.outbox_files()

    run = mixed.cli(*argv, env={"DIGEST_PICKS_RULE": "shop_rules_nowhere:picks"})

    line = _one_line(run, argv[0])
    assert "DIGEST_PICKS_RULE='shop_rules_nowhere:picks': cannot import shop_rules_nowhere" in line
    assert mixed.dump() == before
    assert mixed.outbox_files() == mail
    assert mixed.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None
