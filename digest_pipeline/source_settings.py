"""Where the shop's customers, catalogue and orders are read from (`DIGEST_SOURCE_*`).

`DIGEST_SOURCE_DATABASE_URL` names the shop's database (the ledger's when unset) and
`DIGEST_SOURCE_CONFIG` a YAML file that maps each record kind to a table and its columns or to a
SQL query (the demo tables when unset; docs/how-to/connect-your-shop-data.md). Both are checked
when the settings are read, without opening any database; what the database holds is checked
when the source is built (adapters/sql/source_mapping.py). A refusal is `InvalidSource`: one line
naming the variable, the record kind and the key at fault, never a password.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.setting_values import check_database_url, read_small_file

URL_VARIABLE, CONFIG_VARIABLE = "DIGEST_SOURCE_DATABASE_URL", "DIGEST_SOURCE_CONFIG"
#: a mapping file is a few hundred bytes; anything far larger is not one
MAX_CONFIG_BYTES = 256 * 1024
#: each record kind's fields, in the order of its domain dataclass (domain/model.py `Customer`,
#: domain/catalogue.py `Product` and `Order`)
FIELDS: dict[str, tuple[str, ...]] = {
    "customers": ("customer_id", "email", "active", "opted_in"),
    "products": (
        "product_id",
        "title",
        "category",
        "price_cents",
        "currency",
        "url",
        "image_url",
        "created_at",
    ),
    "orders": ("order_id", "customer_id", "product_id", "ordered_at"),
}
#: fields a product may lack: `columns: {image_url: null}` reads every product without one
OPTIONAL = frozenset({"image_url"})
_TABLE_KEYS, _QUERY_KEYS = frozenset({"table", "schema", "columns"}), frozenset({"query"})
#: beside either form: the key of the Dagster asset that writes these records (`team/users`)
_ASSET_KEY = "asset"


class InvalidSource(DigestError, ValueError):
    """The shop's source settings, or what its database holds, cannot give the records."""


@dataclass(frozen=True)
class EntitySource:
    """One record kind's origin: a table with a column per field, or a query naming the fields."""

    #: `customers`, `products` or `orders`
    entity: str
    table: str | None = None
    schema: str | None = None
    #: (field, source column or None for an absent optional field), every field of the kind
    columns: tuple[tuple[str, str | None], ...] = ()
    query: str | None = None
    #: the key path of the team's Dagster asset that writes these records, if it names one:
    #: the digest's assets that read them depend on it, so lineage runs from the team's data
    asset: tuple[str, ...] | None = None

    @property
    def origin(self) -> str:
        """How a refusal names it: `customers (table users)`, `products (query)`."""
        if self.query is not None:
            return f"{self.entity} (query)"
        shown = f"{self.schema}.{self.table}" if self.schema else self.table
        return f"{self.entity} (table {shown})"


def demo_table(entity: str) -> EntitySource:
    """The embedded demo shop's table of `entity`: its own name, a column per field."""
    return EntitySource(entity, table=entity, columns=tuple((f, f) for f in FIELDS[entity]))


@dataclass(frozen=True)
class SourceSettings:
    """The shop's database and how its records map onto customers, products and orders."""

    #: `DIGEST_SOURCE_DATABASE_URL`; None: the ledger's database
    database_url: str | None = field(default=None, repr=False)
    #: `DIGEST_SOURCE_CONFIG`, as given; None: the demo tables
    config: Path | None = None
    #: the kinds the file maps; a kind it leaves out is read from its demo table
    mapped: tuple[EntitySource, ...] = ()

    @property
    def is_default(self) -> bool:
        """Neither variable set: the demo tables in the ledger's database, as always."""
        return self.database_url is None and self.config is None

    @property
    def variable(self) -> str:
        """The variable a refusal about the records names: the file when there is one."""
        return CONFIG_VARIABLE if self.config is not None else URL_VARIABLE

    def entity(self, entity: str) -> EntitySource:
        """Where `entity` is read from: the file's mapping, or the demo table."""
        return next((e for e in self.mapped if e.entity == entity), None) or demo_table(entity)


def read_source(env: Mapping[str, str], root: Path) -> SourceSettings:
    """`DIGEST_SOURCE_DATABASE_URL` and `DIGEST_SOURCE_CONFIG` (relative to `root`), checked.

    Raises:
        InvalidSource: one line naming the variable and what is wrong with it.
    """
    url = _database_url(env.get(URL_VARIABLE, "").strip())
    raw = env.get(CONFIG_VARIABLE, "").strip()
    if not raw:
        return SourceSettings(url)
    path = Path(raw) if Path(raw).is_absolute() else root / raw
    name = f"{CONFIG_VARIABLE}={raw}"
    mapped = _parse(_load(path, name), name)
    return SourceSettings(url, Path(raw), mapped)


def _database_url(raw: str) -> str | None:
    """The source URL, refused as `DIGEST_DATABASE_URL` is: never repeating it (a password)."""
    return check_database_url(raw, URL_VARIABLE, "shop.db", error=InvalidSource) if raw else None


def _load(path: Path, name: str) -> Any:
    data = read_small_file(path, name, MAX_CONFIG_BYTES, "a mapping", error=InvalidSource)
    try:
        return yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InvalidSource(f"{name}: not UTF-8 text") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InvalidSource(f"{name}: not YAML{where}") from e


def _parse(doc: Any, name: str) -> tuple[EntitySource, ...]:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InvalidSource(f"{name}: must map customers, products and/or orders")
    unknown = sorted(str(k) for k in doc if k not in FIELDS)
    if unknown:
        raise InvalidSource(
            f"{name}: unknown key {unknown[0]!r}; use customers, products and/or orders"
        )
    return tuple(_entity(entity, doc[entity], f"{name}: {entity}") for entity in doc)


def _entity(entity: str, spec: Any, name: str) -> EntitySource:
    if not isinstance(spec, dict) or not spec:
        raise InvalidSource(f"{name}: must hold `table` (with optional `columns`) or `query`")
    asset = _asset(spec[_ASSET_KEY], f"{name}.{_ASSET_KEY}") if _ASSET_KEY in spec else None
    keys = {str(k) for k in spec} - {_ASSET_KEY}
    if not (keys <= _TABLE_KEYS or keys <= _QUERY_KEYS) or not keys & {"table", "query"}:
        raise InvalidSource(
            f"{name}: use either `table` (with optional `schema` and `columns`) or `query`, "
            f"not {', '.join(sorted(keys))}"
        )
    if "query" in spec:
        return EntitySource(entity, query=_query(spec["query"], f"{name}.query"), asset=asset)
    table = _name(spec["table"], f"{name}.table")
    schema = _name(spec["schema"], f"{name}.schema") if "schema" in spec else None
    columns = _columns(entity, spec.get("columns") or {}, f"{name}.columns")
    return EntitySource(entity, table, schema, columns, asset=asset)


def _asset(value: Any, name: str) -> tuple[str, ...]:
    """An asset key as Dagster spells it in the UI: its path parts joined by `/`."""
    parts = tuple(p.strip() for p in value.split("/")) if isinstance(value, str) else ()
    if not parts or not all(p.replace("_", "").replace("-", "").isalnum() for p in parts):
        raise InvalidSource(
            f"{name}: must be an asset key such as users or shop/users (letters, digits, _ and -)"
        )
    return parts


def _query(value: Any, name: str) -> str:
    # a trailing `;` is how most people end a statement; it cannot stand inside a subquery
    query = value.strip().rstrip(";").strip() if isinstance(value, str) else ""
    if not query:
        raise InvalidSource(f"{name}: must be one SELECT statement")
    return query


def _name(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidSource(f"{name}: must be a name (quote it if YAML reads it as something else)")
    return value.strip()


def _columns(entity: str, value: Any, name: str) -> tuple[tuple[str, str | None], ...]:
    """Every field with its column: the file's, else the column of the field's own name.

    Only names: a mapped value is quoted as an identifier, never read as SQL, so a column file
    cannot smuggle a statement in; an expression (`deleted_at IS NULL`) belongs in a `query`.
    """
    if not isinstance(value, dict):
        raise InvalidSource(f"{name}: must map fields to column names")
    fields = FIELDS[entity]
    unknown = sorted(str(k) for k in value if k not in fields)
    if unknown:
        raise InvalidSource(
            f"{name}: {unknown[0]!r} is not a field of {entity}; the fields are {', '.join(fields)}"
        )
    mapped: list[tuple[str, str | None]] = []
    for f in fields:
        column = value.get(f, f)
        if column is None and f in OPTIONAL:
            mapped.append((f, None))
            continue
        if not isinstance(column, str) or not column.strip():
            raise InvalidSource(
                f"{name}.{f}: must be a column name; an expression belongs in a `query`"
                + (" (or null: no such column)" if f in OPTIONAL else "")
            )
        mapped.append((f, column.strip()))
    return tuple(mapped)


def require_demo_source(source: SourceSettings) -> None:
    """Refuses `digest seed` while a shop source is set.

    The demo rows go into the ledger's database, where a configured source does not read them,
    and `--period` would freeze the shop's real customers into a ledger marked as the demo's.
    """
    if source.is_default:
        return
    names = [
        v
        for v, set_ in ((URL_VARIABLE, source.database_url), (CONFIG_VARIABLE, source.config))
        if set_
    ]
    raise InvalidSource(
        f"{' and '.join(names)} set: digest seed writes the demo shop into the ledger database, "
        "which the configured source does not read; unset them to seed the demo"
    )
