"""The shop's brand as every digest shows it: its name, logo, two colours and price locale.

Each value goes into the HTML part (a colour into a `style` attribute, the logo into an `src`),
so each is checked to a shape that cannot break out of where it goes: a `#rrggbb` colour, an
https link, one printable line. The defaults are the look the package's templates always had.
"""

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from digest_pipeline.domain.catalogue import encodable, is_web_link

#: the templates a digest is made of, each of which `DIGEST_TEMPLATE_DIR` may replace by name
TEMPLATE_NAMES = (
    "digest.html.j2",
    "digest.txt.j2",
    "pick.html.j2",
    "pick.txt.j2",
    "preheader.txt.j2",
    "subject.txt.j2",
)
DEFAULT_SHOP_NAME = "Example Shop"
#: the "View product" buttons' colour in the package's templates
DEFAULT_COLOR = "#2563eb"
#: the page colour around the digest's card in the package's templates
DEFAULT_BACKGROUND_COLOR = "#f4f4f5"
#: a shop name is a brand, not a sentence; it shows in the subject line of every digest
SHOP_NAME_MAX = 100
_HEX_COLOR = re.compile(r"#[0-9a-fA-F]{6}")


@dataclass(frozen=True)
class Brand:
    """What the templates know of the shop (`brand` in every template, docs: brand-and-templates).

    `locale` None keeps the package's own price format (`€1,234.50`, `19.90 CHF`); a CLDR locale
    such as `de_DE` formats prices as that locale writes them (`19,90 €`).
    """

    shop_name: str = DEFAULT_SHOP_NAME
    #: an https image shown instead of the shop's name at the top of the HTML part
    logo_url: str | None = None
    #: the buttons' colour, `#rrggbb`
    color: str = DEFAULT_COLOR
    #: the page colour around the digest, `#rrggbb`
    background_color: str = DEFAULT_BACKGROUND_COLOR
    locale: str | None = None


def shop_name(raw: str) -> str:
    """`DIGEST_SHOP_NAME`'s value: one printable line of at most `SHOP_NAME_MAX` characters.

    Raises:
        ValueError: empty, a line break or other control character, too long, or text UTF-8
            cannot encode.
    """
    name = raw.strip()
    if not name or not name.isprintable() or not encodable(name):
        raise ValueError("must be one line of printable text")
    if len(name) > SHOP_NAME_MAX:
        raise ValueError(f"must be at most {SHOP_NAME_MAX} characters")
    return name


def logo_url(raw: str) -> str:
    """`DIGEST_BRAND_LOGO_URL`'s value: an https web link (`catalogue.is_web_link`).

    Raises:
        ValueError: any other scheme (a mail client blocks or warns about plain http images),
            or a link `is_web_link` refuses (quotes, whitespace, credentials before the host).
    """
    url = raw.strip()
    if not is_web_link(url) or urlsplit(url).scheme != "https":
        raise ValueError(
            "must be an https:// link to an image, e.g. https://cdn.shop.example/logo.png"
        )
    return url


def hex_color(raw: str) -> str:
    """A `DIGEST_BRAND_*COLOR` value: `#` and six hex digits, lower-cased.

    Raises:
        ValueError: anything else; a colour name or `rgb(…)` could carry more CSS than a colour.
    """
    color = raw.strip()
    if not _HEX_COLOR.fullmatch(color):
        raise ValueError("must be a hex colour #rrggbb, e.g. #1a2b3c")
    return color.lower()


def brand_problem(brand: Brand) -> str | None:
    """Why the logo or a colour of `brand` is not what its setting accepts, or None.

    A composer built without the settings (a test's, a benchmark's) checks its brand here; the
    shop name needs only the composer's own check (it is escaped wherever it goes).
    """
    checks = (
        ("logo URL", brand.logo_url, logo_url),
        ("brand colour", brand.color, hex_color),
        ("background colour", brand.background_color, hex_color),
    )
    for name, value, check in checks:
        if value is None:
            continue
        try:
            check(value)
        except ValueError:
            return f"the {name} is not what its setting accepts"
    return None
