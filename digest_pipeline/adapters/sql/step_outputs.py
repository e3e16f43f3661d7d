"""The step outputs Dagster steps hand each other, kept in the ledger database as JSON.

Any step on any machine that reaches the run's ledger reaches its inputs too; no value lives on
a launcher's or a worker's disk. Only JSON-shaped values are accepted (the fan-out's batch
numbers and count dicts), so nothing is pickled and nothing large is stored.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.schema import step_outputs
from digest_pipeline.domain.errors import DigestError

#: bigger than any value of this project's graph by far; a larger one is a wiring mistake
MAX_VALUE_CHARS = 64 * 1024


class StepOutputError(DigestError):
    """A step output that cannot be stored, or an input whose output is not in the ledger."""


@dataclass(frozen=True)
class OutputAddress:
    """Where one output of one step of one run lives (`mapping_key` is "" when not mapped)."""

    run_id: str
    step_key: str
    output_name: str
    mapping_key: str = ""

    def __str__(self) -> str:
        mapped = f"[{self.mapping_key}]" if self.mapping_key else ""
        return f"{self.step_key}.{self.output_name}{mapped} of run {self.run_id}"


class SqlStepOutputs:
    """Stores and loads step outputs; prunes those older than a cut-off."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def put(self, address: OutputAddress, value: Any, now: datetime) -> None:
        """Stores `value` at `address`, replacing what a retry of the same step stored."""
        try:
            text = json.dumps(value, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise StepOutputError(f"{address} is not a JSON value: {exc}") from exc
        if len(text) > MAX_VALUE_CHARS:
            raise StepOutputError(f"{address} is {len(text)} characters; at most {MAX_VALUE_CHARS}")
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        row = {
            "run_id": address.run_id,
            "step_key": address.step_key,
            "output_name": address.output_name,
            "mapping_key": address.mapping_key,
            "value": text,
            "created_at": now,
        }
        insert = dialect.insert(step_outputs).values(**row)
        upsert = insert.on_conflict_do_update(
            index_elements=[c.name for c in step_outputs.primary_key.columns],
            set_={"value": insert.excluded.value, "created_at": insert.excluded.created_at},
        )
        with self._engine.begin() as conn:
            conn.execute(upsert)

    def get(self, address: OutputAddress) -> Any:
        """The value stored at `address`; StepOutputError when there is none."""
        c = step_outputs.c
        query = select(c.value).where(
            c.run_id == address.run_id,
            c.step_key == address.step_key,
            c.output_name == address.output_name,
            c.mapping_key == address.mapping_key,
        )
        with self._engine.connect() as conn:
            text = conn.execute(query).scalar_one_or_none()
        if text is None:
            raise StepOutputError(
                f"{address} is not in the ledger (pruned, or written to another ledger): "
                "re-execute the run from its first step"
            )
        return json.loads(text)

    def prune(self, before: datetime) -> int:
        """Deletes the outputs written before `before`; returns how many."""
        with self._engine.begin() as conn:
            return conn.execute(
                delete(step_outputs).where(step_outputs.c.created_at < before)
            ).rowcount
