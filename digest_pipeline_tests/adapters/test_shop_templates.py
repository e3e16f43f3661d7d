"""A shop's own templates and brand: one file replaces one template, and a template that would
send digests without the unsubscribe link or the postal address never gets past the start.

The composer is built as every face builds it (`wiring.build_composer` from `load_settings`), so
a refusal is the one-line `InvalidSetting` the CLI and the Dagster resources report.
"""

import re
from pathlib import Path
from typing import Any

import pytest

from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.mail.templates import TemplateRefused
from digest_pipeline.domain.brand import TEMPLATE_NAMES, Brand
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import Message
from digest_pipeline.settings import InvalidSetting, load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.adapters.test_render import (
    RECIPIENT,
    composer,
    item_for,
    parse,
    parts,
    picks,
    product,
)
from digest_pipeline_tests.builders import SHOP_LINK_SETTINGS, SHOP_POSTAL_ADDRESS
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.fakes import FixedClock

PACKAGE_TEMPLATES = Path(__file__).resolve().parents[2] / "digest_pipeline" / "templates"
LOGO = "https://cdn.shop.example/brand/logo.png"
#: the package's digest.txt.j2 with one line of the shop's own
OWN_TEXT_LINE = "Greetings from the tea room."


def package_template(name: str) -> str:
    return (PACKAGE_TEMPLATES / name).read_text(encoding="utf-8")


def templates(tmp_path: Path, **files: str) -> Path:
    """A template directory holding `files` (`digest_txt="…"` is `digest.txt.j2`)."""
    folder = tmp_path / "shop-templates"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name.replace('_', '.')}.j2").write_text(text, encoding="utf-8")
    return folder


def built(tmp_path: Path, **env: str) -> Jinja2Composer:
    settings = load_settings({**SHOP_LINK_SETTINGS, **env}, tmp_path)
    made = build_composer(settings, FixedClock(T0))
    assert isinstance(made, Jinja2Composer)
    return made


def compose_with(made: Jinja2Composer, *payloads: dict[str, Any]) -> Message:
    item = item_for()
    return made.compose(item, RECIPIENT, picks(item.key, *payloads))


def refusal(tmp_path: Path, **env: str) -> str:
    with pytest.raises(InvalidSetting) as refused:
        built(tmp_path, **env)
    line = str(refused.value)
    assert "\n" not in line
    return line


def test_one_template_in_the_directory_replaces_that_template_and_no_other(tmp_path):
    own = package_template("digest.txt.j2").replace(
        "Happy shopping,", f"{OWN_TEXT_LINE}\nHappy shopping,"
    )
    folder = templates(tmp_path, digest_txt=own)
    default = compose_with(built(tmp_path), product(1), product(2))

    message = compose_with(built(tmp_path, DIGEST_TEMPLATE_DIR=str(folder)), product(1), product(2))

    assert OWN_TEXT_LINE in message.text
    assert message.text.replace(f"{OWN_TEXT_LINE}\n", "") == default.text
    # the other five are the package's, byte for byte
    assert (message.html, message.subject) == (default.html, default.subject)


def test_a_relative_template_directory_is_under_the_project_folder(tmp_path):
    templates(tmp_path, subject_txt="{{ shop_name }} this week: {{ picks[0].title }}")

    message = compose_with(built(tmp_path, DIGEST_TEMPLATE_DIR="shop-templates"), product(1))

    assert message.subject == "Example Shop this week: Walnut chopping board 1"


def test_the_brand_reaches_both_parts(tmp_path):
    made = built(
        tmp_path,
        DIGEST_SHOP_NAME="Tea & Kettle",
        DIGEST_BRAND_LOGO_URL=LOGO,
        DIGEST_BRAND_COLOR="#1A2B3C",
        DIGEST_BRAND_BACKGROUND_COLOR="#fafaf0",
    )

    plain, html = parts(parse(compose_with(made, product(1))))

    assert "Tea & Kettle" in plain
    assert "Tea &amp; Kettle" in html
    assert "Tea & Kettle" not in html
    assert f'<img src="{LOGO}" alt="Tea &amp; Kettle"' in html
    assert "background-color:#1a2b3c;" in html
    assert html.count("background-color:#fafaf0;") == 2
    # the package's own colours are gone where the brand's went
    assert "#2563eb" not in html
    assert "#f4f4f5" not in html


def test_the_default_brand_is_the_package_look(tmp_path):
    message = compose_with(built(tmp_path), product(1))
    html = message.html or ""

    assert "<img" not in html.split("<tr>")[2]  # the header cell holds the name, no logo
    assert "background-color:#2563eb;" in html
    assert "background-color:#f4f4f5;" in html
    assert message.subject.startswith("Your Example Shop picks")


@pytest.mark.parametrize(
    ("locale", "price", "shown"),
    [
        (None, "19.90", "€19.90"),  # the package's format, as before locales
        (None, "1234.50", "€1,234.50"),
        ("de_DE", "19.90", "19,90\xa0€"),  # Babel's CLDR: a no-break space before the symbol
        ("de_DE", "1234.50", "1.234,50\xa0€"),
        ("de-DE", "19.90", "19,90\xa0€"),
        ("en_GB", "1234.50", "€1,234.50"),
    ],
)
def test_prices_are_written_in_the_shops_locale_in_both_parts(tmp_path, locale, price, shown):
    env = {"DIGEST_LOCALE": locale} if locale else {}

    message = compose_with(built(tmp_path, **env), product(1, price=price, currency="EUR"))

    plain, html = parts(parse(message))
    assert f"({shown})" in plain
    assert f">{shown}</p>" in html


def test_the_locale_is_part_of_the_pick_cache_key(tmp_path):
    # the same product through two composers of two locales: each shows its own format
    german = compose_with(built(tmp_path, DIGEST_LOCALE="de_DE"), product(1, price="19.90"))
    plain = compose_with(composer(), product(1, price="19.90"))

    assert "19,90\xa0€" in german.text
    assert "€19.90" not in german.text
    assert "€19.90" in plain.text


def test_the_check_needs_the_unsubscribe_link_in_the_text_part(tmp_path):
    without = package_template("digest.txt.j2").replace(
        "Unsubscribe with one click: {{ unsubscribe_url }}\n", ""
    )
    folder = templates(tmp_path, digest_txt=without)

    line = refusal(tmp_path, DIGEST_TEMPLATE_DIR=str(folder))

    assert line == (
        f"DIGEST_TEMPLATE_DIR: {folder / 'digest.txt.j2'} renders no unsubscribe link: "
        "output {{ unsubscribe_url }}"
    )


def test_the_check_needs_the_postal_address_in_the_html_part(tmp_path):
    without = package_template("digest.html.j2").replace("{{ postal_address }}", "")
    folder = templates(tmp_path, digest_html=without)

    line = refusal(tmp_path, DIGEST_TEMPLATE_DIR=str(folder))

    assert line == (
        f"DIGEST_TEMPLATE_DIR: {folder / 'digest.html.j2'} renders no postal address: "
        "output {{ postal_address }}"
    )
    assert SHOP_POSTAL_ADDRESS not in line


def test_a_link_only_in_one_branch_is_caught_by_the_sparse_sample(tmp_path):
    # the full sample greets Ada by name; the sparse one has no name and no link here
    own = package_template("digest.txt.j2").replace(
        "Unsubscribe with one click: {{ unsubscribe_url }}",
        "{% if customer_name %}Unsubscribe: {{ unsubscribe_url }}{% endif %}",
    )
    folder = templates(tmp_path, digest_txt=own)

    assert "renders no unsubscribe link" in refusal(tmp_path, DIGEST_TEMPLATE_DIR=str(folder))


def test_the_html_check_reads_the_link_as_autoescaping_writes_it(tmp_path):
    # `&` in the link is `&amp;` in the HTML part: still the link, so the package's passes
    folder = templates(tmp_path, subject_txt="{{ shop_name }}: {{ picks[0].title }}")
    link = "https://shop.example/u?c={customer_id}&t={token}"

    made = built(tmp_path, DIGEST_TEMPLATE_DIR=str(folder), DIGEST_UNSUBSCRIBE_URL=link)

    assert "&amp;t=" in (compose_with(made, product(1)).html or "")


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("pick_html", "<p>{{ pick.title </p>\n", r"pick\.html\.j2 line 1: unexpected '/'"),
        ("subject_txt", "{{ shopname }}", r"subject\.txt\.j2 line 1: 'shopname' is undefined"),
        ("preheader_txt", "\n\n{{ 1 / 0 }}", r"preheader\.txt\.j2 line 3: division by zero"),
        ("subject_txt", "  \n", r"subject\.txt\.j2 renders no subject$"),
        (
            "digest_html",
            "{% include 'footer.html.j2' %}",
            r"digest\.html\.j2 line 1: cannot find template footer\.html\.j2",
        ),
    ],
    ids=["syntax", "undefined", "raises", "empty-subject", "missing-include"],
)
def test_a_template_that_cannot_render_is_refused_in_one_line(tmp_path, name, text, says):
    folder = templates(tmp_path, **{name: text})

    line = refusal(tmp_path, DIGEST_TEMPLATE_DIR=str(folder))

    assert line.startswith(f"DIGEST_TEMPLATE_DIR: {folder}/")
    assert re.search(says, line), line


def test_a_template_that_is_not_utf8_is_refused(tmp_path):
    folder = templates(tmp_path)
    (folder / "digest.txt.j2").write_bytes("caf\xe9 {{ unsubscribe_url }}".encode("latin-1"))

    assert refusal(tmp_path, DIGEST_TEMPLATE_DIR=str(folder)).endswith(
        "digest.txt.j2: is not UTF-8"
    )


def test_a_partial_the_shops_template_includes_is_named_when_it_fails(tmp_path):
    folder = templates(tmp_path, digest_txt="{% include 'parts/footer.txt.j2' %}")
    (folder / "parts").mkdir()
    (folder / "parts" / "footer.txt.j2").write_text("{{ nope }}", encoding="utf-8")

    line = refusal(tmp_path, DIGEST_TEMPLATE_DIR=str(folder))

    assert (
        line
        == f"DIGEST_TEMPLATE_DIR: {folder / 'parts' / 'footer.txt.j2'} line 1: 'nope' is undefined"
    )


def test_the_composer_itself_refuses_without_the_settings(tmp_path):
    # a composer built directly (a test's, a benchmark's) runs the same check
    folder = templates(tmp_path, digest_txt="{{ pick_blocks.text }}")
    with pytest.raises(TemplateRefused, match="renders no unsubscribe link"):
        Jinja2Composer(
            sender="digest@example.com",
            unsubscribe_url="https://shop.example/u/{customer_id}?token={token}",
            unsubscribe_secret="s3cret",
            clock=FixedClock(T0),
            template_dir=folder,
        )


@pytest.mark.parametrize(
    "brand",
    [Brand(color="red"), Brand(logo_url="javascript:alert(1)"), Brand(locale="xx_YY")],
    ids=["colour", "logo", "locale"],
)
def test_a_brand_its_settings_would_refuse_refuses_every_item(brand):
    made = Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/u/{customer_id}?token={token}",
        unsubscribe_secret="s3cret",
        clock=FixedClock(T0),
        brand=brand,
    )
    with pytest.raises(RenderError, match=r"not what its setting accepts|not one Babel knows"):
        compose_with(made, product(1))


def test_the_package_templates_are_the_six_a_directory_may_replace():
    assert sorted(p.name for p in PACKAGE_TEMPLATES.glob("*.j2")) == sorted(TEMPLATE_NAMES)


def test_a_forked_helpers_composer_has_the_same_brand_and_templates(tmp_path):
    from digest_pipeline.adapters.clock import SystemClock

    own = package_template("digest.txt.j2").replace("Happy shopping,", "Cheers,")
    folder = templates(tmp_path, digest_txt=own)
    settings = load_settings(
        {**SHOP_LINK_SETTINGS, "DIGEST_TEMPLATE_DIR": str(folder), "DIGEST_LOCALE": "de_DE"},
        tmp_path,
    )
    original = build_composer(settings, SystemClock())
    assert isinstance(original, Jinja2Composer)
    recipe = original.recipe()
    assert recipe is not None

    made = recipe()

    assert isinstance(made, Jinja2Composer)
    message = compose_with(made, product(1, price="19.90"))
    assert "Cheers," in message.text
    assert "19,90\xa0€" in message.text
