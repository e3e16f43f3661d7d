"""A pick's price as the digest shows it: the package's own format, or a locale's (CLDR, Babel).

Without a locale (`DIGEST_LOCALE` unset) a price keeps the format every digest always had: the
symbol before the amount for EUR, USD and GBP (`€1,234.50`), the ISO code after it otherwise
(`1,234.50 CHF`). With one, Babel writes it as that locale does, from the CLDR data it ships:
`de_DE` gives `1.234,50 €` (a no-break space before the symbol), `fr_FR` a narrow no-break space
between thousands, and each currency keeps its own decimals (`¥1,250`).
"""

from decimal import Decimal

from babel import Locale, UnknownLocaleError
from babel.numbers import format_currency

_SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£"}


def formatted_price(amount: Decimal, currency: str, locale: str | None) -> str:
    """`amount` of `currency` (an ISO 4217 code) as the digest shows it in `locale`."""
    if locale is None:
        symbol = _SYMBOLS.get(currency)
        return f"{symbol}{amount:,.2f}" if symbol else f"{amount:,.2f} {currency}"
    return format_currency(amount, currency, locale=locale)


def known_locale(locale: str) -> bool:
    """Whether Babel knows `locale` (`de_DE`, `en_GB`, …)."""
    try:
        Locale.parse(locale)
    except (ValueError, TypeError, UnknownLocaleError):
        return False
    return True
