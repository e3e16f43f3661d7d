"""The shop's look and picks settings: working defaults, and one line naming the variable for a
bad value, read with every other setting, so every command refuses it at start."""

from pathlib import Path

import pytest

from digest_pipeline.domain.brand import Brand
from digest_pipeline.domain.catalogue import DEFAULT_PICKS_RULE, popular_in_your_categories
from digest_pipeline.settings import InvalidSetting, load_settings
from digest_pipeline.shop_settings import ShopSettings, load_picks_rule
from digest_pipeline_tests import picks_rules


def test_the_defaults_are_the_package_look_and_the_built_in_rule(tmp_path):
    shop = load_settings({}, tmp_path).shop

    assert shop == ShopSettings()
    assert shop.brand == Brand("Example Shop", None, "#2563eb", "#f4f4f5", None)
    assert shop.template_dir is None
    assert shop.picks_rule is popular_in_your_categories
    assert load_picks_rule(DEFAULT_PICKS_RULE) is popular_in_your_categories


def test_every_value_is_read(tmp_path):
    folder = tmp_path / "look"
    folder.mkdir()
    (folder / "subject.txt.j2").write_text("{{ shop_name }}", encoding="utf-8")
    env = {
        "DIGEST_TEMPLATE_DIR": "look",
        "DIGEST_SHOP_NAME": "  Tea & Kettle ",
        "DIGEST_BRAND_LOGO_URL": "https://cdn.shop.example/logo.svg",
        "DIGEST_BRAND_COLOR": "#1A2B3C",
        "DIGEST_BRAND_BACKGROUND_COLOR": "#ffffff",
        "DIGEST_LOCALE": "de-DE",
        "DIGEST_PICKS_RULE": "digest_pipeline_tests.picks_rules:cheapest_first",
    }

    shop = load_settings(env, tmp_path).shop

    assert shop.brand == Brand(
        "Tea & Kettle", "https://cdn.shop.example/logo.svg", "#1a2b3c", "#ffffff", "de_DE"
    )
    assert shop.template_dir == folder.resolve()
    assert shop.picks_rule is picks_rules.cheapest_first
    assert shop.picks_rule_name == "digest_pipeline_tests.picks_rules:cheapest_first"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DIGEST_SHOP_NAME", "Tea\nShop", "must be one line of printable text"),
        ("DIGEST_SHOP_NAME", "x" * 101, "at most 100 characters"),
        ("DIGEST_BRAND_LOGO_URL", "http://cdn.shop.example/logo.png", "must be an https://"),
        ("DIGEST_BRAND_LOGO_URL", 'https://cdn.example/l.png" onerror="x', "must be an https://"),
        ("DIGEST_BRAND_COLOR", "red", "must be a hex colour #rrggbb"),
        ("DIGEST_BRAND_COLOR", "#123;background:url(x)", "must be a hex colour #rrggbb"),
        ("DIGEST_BRAND_BACKGROUND_COLOR", "#fff", "must be a hex colour #rrggbb"),
        ("DIGEST_LOCALE", "xx_YY", "must be a locale Babel knows"),
        ("DIGEST_LOCALE", "german", "must be a locale Babel knows"),
        ("DIGEST_TEMPLATE_DIR", "no-such-folder", "is not a directory"),
        ("DIGEST_PICKS_RULE", "shop_rules", "must be package.module:function"),
        ("DIGEST_PICKS_RULE", "shop_rules:picks()", "must be package.module:function"),
        (
            "DIGEST_PICKS_RULE",
            "shop_rules_nowhere:picks",
            "cannot import shop_rules_nowhere (ModuleNotFoundError: "
            "No module named 'shop_rules_nowhere')",
        ),
        (
            "DIGEST_PICKS_RULE",
            "digest_pipeline_tests.picks_rules:cheapest",
            "digest_pipeline_tests.picks_rules has no cheapest",
        ),
        (
            "DIGEST_PICKS_RULE",
            "digest_pipeline_tests.picks_rules:not_a_rule",
            "not_a_rule is int, not a function",
        ),
        (
            "DIGEST_PICKS_RULE",
            "digest_pipeline_tests.picks_rules:two_arguments",
            "two_arguments must take one argument, the PickRequest",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable(tmp_path, name, value, says):
    with pytest.raises(InvalidSetting) as refused:
        load_settings({name: value}, tmp_path)

    line = str(refused.value)
    assert line.startswith(f"{name}=")
    assert says in line
    assert "\n" not in line


def test_a_template_directory_without_any_of_the_six_templates_is_refused(tmp_path):
    # a misspelt name would otherwise leave every template the package's, silently
    (tmp_path / "look").mkdir()
    (tmp_path / "look" / "digest.htm.j2").write_text("x", encoding="utf-8")

    with pytest.raises(InvalidSetting, match=r"DIGEST_TEMPLATE_DIR='look': holds none of"):
        load_settings({"DIGEST_TEMPLATE_DIR": "look"}, tmp_path)


def test_a_rule_module_that_fails_to_import_is_refused_with_its_error_class(tmp_path, monkeypatch):
    (tmp_path / "broken_rules.py").write_text("import nothing_here_at_all\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(InvalidSetting) as refused:
        load_settings({"DIGEST_PICKS_RULE": "broken_rules:picks"}, Path(tmp_path))

    assert str(refused.value) == (
        "DIGEST_PICKS_RULE='broken_rules:picks': cannot import broken_rules "
        "(ModuleNotFoundError: No module named 'nothing_here_at_all')"
    )
