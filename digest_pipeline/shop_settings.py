"""A shop's own look and picks, outside the package: templates, brand, locale and picks rule.

`read_shop` reads `DIGEST_TEMPLATE_DIR`, `DIGEST_SHOP_NAME`, `DIGEST_BRAND_*`, `DIGEST_LOCALE` and
`DIGEST_PICKS_RULE` when the settings are read, so a bad value stops every command at start with
one line naming the variable (`InvalidSetting`, exit 2): a directory that is not there, a colour
that is not `#rrggbb`, a locale Babel does not know, a picks rule that cannot be imported or
called. What the templates render is checked when the composer is built (adapters/mail/templates.py).
"""

import importlib
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from babel import Locale, UnknownLocaleError

from digest_pipeline.domain.brand import (
    DEFAULT_BACKGROUND_COLOR,
    DEFAULT_COLOR,
    DEFAULT_SHOP_NAME,
    TEMPLATE_NAMES,
    Brand,
    hex_color,
    logo_url,
    shop_name,
)
from digest_pipeline.domain.catalogue import (
    DEFAULT_PICKS_RULE,
    PicksRule,
    popular_in_your_categories,
)
from digest_pipeline.setting_values import InvalidSetting, read_value

TEMPLATE_DIR_VARIABLE = "DIGEST_TEMPLATE_DIR"
PICKS_RULE_VARIABLE = "DIGEST_PICKS_RULE"
#: `package.module:function` (or `:Class.method`): Python identifiers, dotted
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
#: an import error's first line, as the refusal quotes it
_REASON_MAX = 160


@dataclass(frozen=True)
class ShopSettings:
    """How a shop's digests look and what they pick (`Settings.shop`)."""

    brand: Brand = field(default_factory=Brand)
    #: `DIGEST_TEMPLATE_DIR`: templates here replace the package's of the same name; None: none
    template_dir: Path | None = None
    #: `DIGEST_PICKS_RULE`, imported and checked callable
    picks_rule: PicksRule = popular_in_your_categories
    #: the import path it was loaded from, as the logs and the docs name it
    picks_rule_name: str = DEFAULT_PICKS_RULE


def read_shop(env: Mapping[str, str], root: Path) -> ShopSettings:
    """The shop's look and picks from `env`; a relative `DIGEST_TEMPLATE_DIR` is under `root`.

    Raises:
        InvalidSetting: one line naming the variable at fault.
    """
    try:
        return _read_shop(env, root)
    except InvalidSetting:
        raise
    except ValueError as e:
        raise InvalidSetting(str(e)) from e


def _read_shop(env: Mapping[str, str], root: Path) -> ShopSettings:
    brand = Brand(
        shop_name=read_value(env, "DIGEST_SHOP_NAME", DEFAULT_SHOP_NAME, shop_name),
        logo_url=read_value(env, "DIGEST_BRAND_LOGO_URL", None, logo_url),
        color=read_value(env, "DIGEST_BRAND_COLOR", DEFAULT_COLOR, hex_color),
        background_color=read_value(
            env, "DIGEST_BRAND_BACKGROUND_COLOR", DEFAULT_BACKGROUND_COLOR, hex_color
        ),
        locale=read_value(env, "DIGEST_LOCALE", None, locale_name),
    )
    directory = read_value(env, TEMPLATE_DIR_VARIABLE, None, lambda raw: template_dir(root / raw))
    path = env.get(PICKS_RULE_VARIABLE, "").strip() or DEFAULT_PICKS_RULE
    return ShopSettings(brand, directory, _rule(path), path)


def locale_name(raw: str) -> str:
    """`DIGEST_LOCALE`'s value: a CLDR locale Babel knows (`de_DE`, `fr-CH`), as `de_DE`."""
    try:
        return str(Locale.parse(raw.replace("-", "_")))
    except (ValueError, TypeError, UnknownLocaleError) as e:
        raise ValueError("must be a locale Babel knows, e.g. de_DE, fr_FR or en_GB") from e


def template_dir(path: Path) -> Path:
    """`DIGEST_TEMPLATE_DIR`'s value: a directory holding at least one of the digest templates.

    A directory with none of them is refused: a misspelt file name would otherwise leave every
    template the package's, silently.
    """
    if not path.is_dir():
        raise ValueError("is not a directory")
    if not any((path / name).is_file() for name in TEMPLATE_NAMES):
        raise ValueError(f"holds none of {', '.join(TEMPLATE_NAMES)}")
    return path.resolve()


def _rule(path: str) -> PicksRule:
    try:
        return load_picks_rule(path)
    except ValueError as e:
        raise ValueError(f"{PICKS_RULE_VARIABLE}={path!r}: {e}") from e


def load_picks_rule(path: str) -> PicksRule:
    """The callable `package.module:function` names, checked to take one argument.

    Importing the module runs its code, as any import does; an error there is refused with its
    class and first line (it is about the code, never about a customer).

    Raises:
        ValueError: not `module:function`, the module cannot be imported, it has no such
            attribute, or the attribute is not a callable of one positional argument.
    """
    if not _IMPORT_PATH.fullmatch(path):
        raise ValueError("must be package.module:function")
    module_name, _, attribute = path.partition(":")
    try:
        found: object = importlib.import_module(module_name)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:_REASON_MAX]
        raise ValueError(f"cannot import {module_name} ({type(e).__name__}: {first})") from e
    for name in attribute.split("."):
        if not hasattr(found, name):
            raise ValueError(f"{module_name} has no {attribute}")
        found = getattr(found, name)
    if not callable(found):
        raise ValueError(f"{attribute} is {type(found).__name__}, not a function")
    try:
        inspect.signature(found).bind(object())
    except TypeError as e:
        raise ValueError(f"{attribute} must take one argument, the PickRequest") from e
    except ValueError:
        pass  # a builtin without a signature: called as it is, and its failures are per customer
    # callable and taking one argument: what it answers is checked per customer
    # (catalogue.checked_picks), since no signature can promise it
    rule: PicksRule = found
    return rule
