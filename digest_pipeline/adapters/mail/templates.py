"""The digest templates: the package's six, each replaceable by a same-named file of the shop's.

A file in `DIGEST_TEMPLATE_DIR` replaces the package's template of that name (a Jinja2
`ChoiceLoader`: the shop's directory first, then the package), and the other templates stay the
package's. The composer checks them once, when it is built: every template parses, and a full
and a sparse sample digest render with both parts carrying the unsubscribe link and the postal
address, which no shop may leave out (RFC 8058, CAN-SPAM). Anything else is `TemplateRefused`,
one line naming the template; `wiring.build_composer` reports it as a bad setting.
"""

import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import jinja2
import markupsafe
from jinja2.debug import rewrite_traceback_stack

from digest_pipeline.domain.brand import Brand
from digest_pipeline.domain.catalogue import Product, digest_rows_for
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.model import DigestRow, WorkItem
from digest_pipeline.domain.periods import FIRST_PERIOD, OperationKey
from digest_pipeline.domain.states import DeliveryState

TEMPLATE_DIR_VARIABLE = "DIGEST_TEMPLATE_DIR"
#: the sample digests' customer: a key no real customer's digest of a real week has
_SAMPLE_KEY = OperationKey(FIRST_PERIOD, "template-check")
_SAMPLE_TIME = datetime(2025, 1, 6, tzinfo=UTC)
#: a refusal quotes this much of Jinja2's own message at most (a template's text, not data)
_REASON_MAX = 200


class TemplateRefused(DigestError, ValueError):
    """The digest templates cannot make a digest that carries what every digest must."""


class SampleRenderer(Protocol):
    """What the check needs of the composer: the context and parts `compose` renders."""

    def template_context(self, item: WorkItem, rows: Sequence[DigestRow]) -> dict[str, Any]: ...

    def render_parts(self, context: dict[str, Any]) -> tuple[str, str, str]: ...


def environment(template_dir: Path | None, brand: Brand) -> jinja2.Environment:
    """The templates' environment: the shop's directory first, then the package's templates.

    The HTML templates are autoescaped and the text ones are not; a missing variable raises
    (StrictUndefined) instead of rendering as an empty string. `brand` is every template's.
    """
    package = jinja2.PackageLoader("digest_pipeline", "templates")
    loader: jinja2.BaseLoader = package
    if template_dir is not None:
        loader = jinja2.ChoiceLoader([jinja2.FileSystemLoader(template_dir), package])
    env = jinja2.Environment(
        loader=loader,
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals["brand"] = brand
    return env


def load(env: jinja2.Environment, name: str, template_dir: Path | None) -> jinja2.Template:
    """Template `name`, parsed; one that does not parse is `TemplateRefused` with its line."""
    try:
        return env.get_template(name)
    except jinja2.TemplateSyntaxError as e:
        where = _shown(e.filename or name, template_dir)
        raise TemplateRefused(f"{where} line {e.lineno}: {_first_line(e)}") from e
    except (jinja2.TemplateError, UnicodeDecodeError, OSError) as e:
        reason = "is not UTF-8" if isinstance(e, UnicodeDecodeError) else _first_line(e)
        raise TemplateRefused(f"{_shown(name, template_dir)}: {reason}") from e


def check_templates(renderer: SampleRenderer, template_dir: Path | None) -> None:
    """Renders the sample digests; raises TemplateRefused unless both parts carry the footer.

    The link checked is the one the composer makes for the sample customer; the address is the
    footer's (`DIGEST_POSTAL_ADDRESS`, or the demo's marked placeholder). In the HTML part both
    are looked for as autoescaping writes them.
    """
    for item, rows in _samples():
        try:
            context = renderer.template_context(item, rows)
            subject, text, html = renderer.render_parts(context)
        except Exception as e:
            # a template's own runtime error ({{ 1 / 0 }}) as much as Jinja2's: either would
            # fail every digest, so either stops the start. Rewritten as Jinja2's own `render`
            # does, so its frames name template lines (the composer renders without it).
            raise TemplateRefused(_failed(rewrite_traceback_stack(), template_dir)) from e
        if not subject.strip():
            raise TemplateRefused(f"{_shown('subject.txt.j2', template_dir)} renders no subject")
        required = (
            ("unsubscribe link", "{{ unsubscribe_url }}", context["unsubscribe_url"]),
            ("postal address", "{{ postal_address }}", context["postal_address"]),
        )
        for what, variable, value in required:
            for name, part, shown in (
                ("digest.txt.j2", text, str(value)),
                ("digest.html.j2", html, str(markupsafe.escape(value))),
            ):
                if shown not in part:
                    where = _shown(name, template_dir)
                    raise TemplateRefused(f"{where} renders no {what}: output {variable}")


def _samples() -> list[tuple[WorkItem, list[DigestRow]]]:
    """A full digest (a name, four picks with images and prices) and a sparse one."""
    item = WorkItem(_SAMPLE_KEY, DeliveryState.CLAIMED, _SAMPLE_TIME, None)
    full = [_product(n) for n in range(1, 5)]
    rows = digest_rows_for(_SAMPLE_KEY, full)
    for row in rows:
        row.payload["customer_name"] = "Ada"
    sparse = digest_rows_for(_SAMPLE_KEY, [_product(5)])
    sparse[0].payload.update(image_url=None, price=None)
    return [(item, rows), (item, sparse)]


def _product(n: int) -> Product:
    return Product(
        f"sample-{n}",
        f"Sample product {n}",
        "Sample",
        1990 * n,
        "EUR",
        f"https://shop.example/p/sample-{n}",
        f"https://cdn.shop.example/p/sample-{n}.jpg",
        _SAMPLE_TIME,
    )


def _failed(error: BaseException, template_dir: Path | None) -> str:
    """`<template> line 4: 'x' is undefined`: where in which template the sample failed."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not f.filename.endswith(".py") and not f.filename.startswith("<")
    ]
    if not frames:
        return f"the digest templates failed on a sample digest: {type(error).__name__}"
    where = _shown(frames[-1].filename, template_dir)
    return f"{where} line {frames[-1].lineno}: {_first_line(error)}"


def _shown(path: str, template_dir: Path | None) -> str:
    """`DIGEST_TEMPLATE_DIR: /srv/shop/digest.html.j2`, or `the package's digest.html.j2`."""
    candidate = Path(path)
    if template_dir is not None:
        mine = candidate if candidate.is_absolute() else template_dir / candidate
        # a partial the shop's templates include may sit in a folder of the directory
        if mine.is_relative_to(template_dir) and mine.is_file():
            return f"{TEMPLATE_DIR_VARIABLE}: {mine}"
    return f"the package's {candidate.name}"


def _first_line(error: BaseException) -> str:
    if isinstance(error, jinja2.TemplateNotFound):
        return f"cannot find template {error.name}"
    text = getattr(error, "message", None) or str(error)
    line = (str(text).strip().splitlines() or [type(error).__name__])[0]
    return line[:_REASON_MAX]
