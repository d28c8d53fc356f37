"""The Milvus store's synchronous calls, run in its threads (`milvus.py` is what the gateway awaits): one client,
connected on first use, and every read and write of the catalog and of the collections' rows.

A write answers its mutation's timestamp, which the store's write clock keeps (`milvus_clock.py`); a read takes the
consistency the clock gives it (`level`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr
from pymilvus import MilvusClient

from gateway.observability import quiet_pymilvus
from gateway.search.documents import Collection
from gateway.search.milvus_clock import STRONG, ReadLevel
from gateway.search.milvus_filter import literal
from gateway.search.milvus_rows import (
    CATALOG,
    FIELDS,
    SPARSE,
    TERMS,
    VectorIndex,
    bounded_terms,
    catalog_schema,
    documents_schema,
    ids_expression,
    milvus_name,
    vector_index,
)
from gateway.search.store import CollectionExistsError, DocumentWrite, IndexUpdate

quiet_pymilvus()

FULL_TEXT_SEARCH = (2, 5)  # the Milvus release that brought the BM25 function


class MilvusCalls:
    def __init__(self, uri: str, token: SecretStr | None, timeout: float, index: VectorIndex) -> None:
        self._uri = uri
        self._token = token
        self._timeout = timeout
        self._index = index
        self._client: MilvusClient | None = None
        self._full_text = False  # the server's, known once connected

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def connected(self) -> MilvusClient:
        if self._client is None:
            token = self._token.get_secret_value() if self._token is not None else ""
            client = MilvusClient(uri=self._uri, token=token, timeout=self._timeout)
            if not client.has_collection(CATALOG, timeout=self._timeout):
                client.create_collection(
                    CATALOG,
                    schema=catalog_schema(),
                    index_params=vector_index(client, self._index),
                    consistency_level="Strong",
                    timeout=self._timeout,
                )
            self._full_text = full_text_search(client, self._timeout)
            self._client = client
        return self._client

    def has_full_text(self) -> bool:
        self.connected()
        return self._full_text

    def has_terms(self, target: str) -> bool:
        fields = self.connected().describe_collection(target, timeout=self._timeout)["fields"]
        return any(field["name"] == SPARSE for field in fields)

    def ping(self) -> None:
        self.connected().has_collection(CATALOG, timeout=self._timeout)

    def mutations(self) -> Any:
        """pymilvus' connection handler: its upsert and delete answer the mutation's timestamp (a guarantee for
        later reads), which MilvusClient's drop."""
        return self.connected()._get_connection()

    def catalog_rows(self, expression: str, level: ReadLevel) -> list[dict[str, Any]]:
        rows = self.connected().query(
            CATALOG,
            filter=expression or 'name != ""',
            output_fields=["record"],
            timeout=self._timeout,
            **level.options(),
        )
        return [json.loads(row["record"]) for row in rows]

    def create(self, collection: Collection, lexical: bool) -> int:
        """The collection, with terms and their BM25 where `lexical`, and its record."""
        client = self.connected()
        if self.catalog_rows(f"name == {literal(collection.name)}", STRONG):
            raise CollectionExistsError(collection.name)
        target = milvus_name(collection.name)
        if client.has_collection(target, timeout=self._timeout):  # a create or delete cut short
            client.drop_collection(target, timeout=self._timeout)
        client.create_collection(
            target,
            schema=documents_schema(collection.dimensions, lexical),
            index_params=vector_index(client, self._index, lexical=lexical),
            consistency_level="Strong",  # for other clients: every read of this store states its own
            timeout=self._timeout,
        )
        return self.write_record(collection)

    def write_record(self, collection: Collection) -> int:
        row = {"name": collection.name, "record": json.dumps(collection.record()), "vector": [0.0, 1.0]}
        return int(self.mutations().upsert_rows(CATALOG, [row], timeout=self._timeout).timestamp)

    def drop(self, name: str) -> int:
        removed = self.delete(CATALOG, f"name == {literal(name)}")
        self.connected().drop_collection(milvus_name(name), timeout=self._timeout)  # gone for clients already
        return removed

    def count(self, target: str, expression: str, level: ReadLevel) -> int:
        rows = self.connected().query(
            target, filter=expression, output_fields=["count(*)"], timeout=self._timeout, **level.options()
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def get(self, target: str, ids: list[str], fields: list[str], level: ReadLevel) -> list[dict[str, Any]]:
        if not ids:
            return []
        rows = self.connected().query(
            target, filter=ids_expression(ids), output_fields=fields, timeout=self._timeout, **level.options()
        )
        return list(rows)

    def upsert(self, target: str, documents: Sequence[DocumentWrite], now: int, lexical: bool, level: ReadLevel) -> int:
        existing = self.get(target, [d.id for d in documents], ["id", "created_at"], level)
        created = {row["id"]: row["created_at"] for row in existing}
        rows = [
            {
                "id": d.id,
                "vector": d.vector.tolist(),
                "text": d.text,
                "metadata": d.metadata,
                "created_at": created.get(d.id, now),
                "updated_at": now,
                **({TERMS: bounded_terms(d.terms)} if lexical else {}),
            }
            for d in documents
        ]
        return int(self.mutations().upsert_rows(target, rows, timeout=self._timeout).timestamp)

    def page(self, target: str, after: str | None, limit: int, level: ReadLevel) -> list[dict[str, Any]]:
        """The `limit` smallest ids after `after` with their rows: Milvus answers a query in no stated order, so
        the ids past the cursor are read (ids only) and sorted here."""
        expression = f"id > {literal(after)}" if after is not None else 'id != ""'
        iterator = self.connected().query_iterator(
            target, batch_size=1000, filter=expression, output_fields=["id"], timeout=self._timeout, **level.options()
        )
        ids: list[str] = []
        try:
            while batch := iterator.next():
                ids = sorted(ids + [row["id"] for row in batch])[:limit]
        finally:
            iterator.close()
        rows = self.get(target, ids, FIELDS, level)
        return sorted(rows, key=lambda row: str(row["id"]))

    def set_index(self, target: str, updates: dict[str, IndexUpdate], lexical: bool, level: ReadLevel) -> int:
        """Each row written again whole (Milvus upserts rows), its vector and terms replaced."""
        rows = self.get(target, list(updates), [*FIELDS, "vector"], level)
        for row in rows:
            update = updates[row["id"]]
            if update.vector is not None:
                row["vector"] = update.vector.tolist()
            if lexical:
                row[TERMS] = bounded_terms(update.terms)
        return int(self.mutations().upsert_rows(target, rows, timeout=self._timeout).timestamp) if rows else 0

    def delete_ids(self, target: str, ids: list[str], level: ReadLevel) -> tuple[int, int]:
        found = [row["id"] for row in self.get(target, ids, ["id"], level)]
        return len(found), self.delete(target, ids_expression(found)) if found else 0

    def delete_filter(self, target: str, expression: str, level: ReadLevel) -> tuple[int, int]:
        count = self.count(target, expression, level)
        return count, self.delete(target, expression) if count else 0

    def delete(self, target: str, expression: str) -> int:
        """The delete's timestamp; Milvus 2.3 answers 0 there, so then a timestamp allocated after the delete
        returned (Milvus's timestamps only grow): a guarantee that holds it too."""
        handler = self.mutations()
        timestamp = handler.delete(target, expression, timeout=self._timeout).timestamp
        return int(timestamp or handler.alloc_timestamp(timeout=self._timeout))

    def seal(self, target: str) -> None:
        """Flush: seal the growing segments, so Milvus builds their index (see `milvus_flush.py`)."""
        self.connected().flush(target, timeout=self._timeout)

    def search(
        self,
        target: str,
        query: list[float] | str,
        field: str,
        params: dict[str, Any],
        top_k: int,
        expression: str,
        level: ReadLevel,
    ) -> list[dict[str, Any]]:
        results = self.connected().search(
            target,
            data=[query],
            limit=top_k,
            filter=expression,
            output_fields=FIELDS,
            anns_field=field,
            search_params=params,
            timeout=self._timeout,
            **level.options(),
        )
        return list(results[0]) if results else []


def full_text_search(client: MilvusClient, timeout: float) -> bool:
    """Whether the server has the BM25 function (Milvus 2.5 and later). Milvus Lite does not say its version;
    its releases that speak this client's protocol are built from 2.5 and later."""
    try:
        version = client.get_server_version(timeout=timeout)
    except Exception:  # Milvus Lite answers gRPC's UNIMPLEMENTED, which pymilvus passes on raw
        return True
    found = re.match(r"v?(\d+)\.(\d+)", version)
    return found is None or (int(found[1]), int(found[2])) >= FULL_TEXT_SEARCH
