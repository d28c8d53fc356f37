"""Bad input is refused with 400 (gRPC: INVALID_ARGUMENT) naming the field, never a 5xx: lone surrogates,
bodies nested past the limit, non-finite numbers and out-of-range metadata, in every route's body.

One gateway app (its lifespan, REST through Starlette's TestClient, gRPC through a real channel) over the embedded
search store and an in-memory fake of Triton's embedder (the end-to-end search tests use the real Triton).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.errors import InvalidRequestError, error_response
from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.grpc.pb.gateway.v1 import gateway_pb2_grpc
from gateway.protocol.base import MAX_NESTING_DEPTH
from gateway.protocol.unicode import require_unicode
from gateway.settings import AuthSettings, ChatSettings
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings
from tests.helpers.running_gateway import gateway_settings, scratch_dir

API_KEY = "sk-bad-input-test-0001"
AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
GRPC_AUTH = (("authorization", f"Bearer {API_KEY}"),)
COLLECTION = "probe"
INFO = ModelInfo(name="fake/model", revision="r1", max_batch_size=64, max_sequence_length=128, dimension=4)


class FakeEmbedder:
    """Triton's embedder in memory: a vector from each text's length, one token per character."""

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return INFO

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        vectors = np.array([[len(t) % 7 + 1.0, 1.0, 0.5, 0.25] for t in texts], dtype=np.float32)
        return TritonEmbeddings(
            vectors=vectors,
            token_counts=np.array([len(t) for t in texts], dtype=np.int32),
            truncated=np.zeros(len(texts), dtype=np.bool_),
        )

    async def ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    data = scratch_dir("bad-input-")
    auth = AuthSettings(api_keys=SecretStr(API_KEY), keys_sqlite_path=str(data / "keys.sqlite3"))
    # No chat upstream is reached: every chat body here is refused before the service is asked.
    chat = ChatSettings(base_url="http://127.0.0.1:9", api_key=SecretStr("unused"))
    settings = gateway_settings("127.0.0.1:9", auth=auth, chat=chat)
    with TestClient(create_app(settings, embedder=FakeEmbedder()), headers=AUTH) as test_client:
        created = test_client.post("/v1/collections", json={"name": COLLECTION})
        assert created.status_code == 201, created.text
        document = {"id": "a", "text": "hello", "metadata": {"lang": "en"}}
        assert test_client.post(f"/v1/collections/{COLLECTION}/documents", json={"documents": [document]}).is_success
        yield test_client


@pytest.fixture(scope="module")
def channel(client: TestClient) -> Iterator[grpc.Channel]:
    app: Any = client.app
    with grpc.insecure_channel(f"127.0.0.1:{app.state.grpc.port}") as opened:
        yield opened


def post(client: TestClient, path: str, body: str) -> dict[str, Any]:
    """POST a JSON text as it is (json.dumps writes a lone surrogate as the escape `\\ud800`), expecting a 400."""
    response = client.post(path, content=body.encode())
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


DOCS = f"/v1/collections/{COLLECTION}/documents"
SEARCH = f"/v1/collections/{COLLECTION}/search"
DELETE = f"/v1/collections/{COLLECTION}/documents/delete"
CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (DOCS, {"documents": [{"id": "x\ud800", "text": "t"}]}, "documents[0].id"),
        (DOCS, {"documents": [{"id": "b", "text": "t", "metadata": {"title": "\udfff"}}]},
         "documents[0].metadata.title"),
        (DOCS, {"documents": [{"id": "b", "text": "t", "metadata": {"k\ud800": "v"}}]},
         "documents[0].metadata.k\\ud800"),
        (DOCS, {"documents": [{"id": "b", "text": "t", "metadata": {"tags": ["ok", "\ud83d"]}}]},
         "documents[0].metadata.tags[1]"),
        (SEARCH, {"query": "hi", "filter": {"lang": "\ud800"}}, "filter.lang"),
        (SEARCH, {"query": "hi", "filter": {"$or": [{"l\udfffang": "en"}]}}, "filter.$or[0].l\\udfffang"),
        (DELETE, {"ids": ["a", "\ud800"]}, "ids[1]"),
        (DELETE, {"filter": {"lang": {"$in": ["\ud800"]}}}, "filter.lang.$in[0]"),
        ("/v1/collections", {"name": "c2", "metadata": {"owner": "\ud800"}}, "metadata.owner"),
        ("/v1/collections", {"name": "c2", "query_instruction": "\ud800"}, "query_instruction"),
        ("/v1/admin/keys", {"name": "n\ud800", "team": "t"}, "name"),
        ("/v1/images/generations", {"prompt": "a cat", "style": {"\ud800": 1}}, "style.\\ud800"),
        (CHAT, {"model": "m", "messages": HI, "x": {"\ud800": 1}}, "x.\\ud800"),
    ],
    ids=[
        "document-id",
        "metadata-value",
        "metadata-key",
        "metadata-list-item",
        "filter-value",
        "filter-key",
        "delete-ids",
        "delete-filter",
        "collection-metadata",
        "query-instruction",
        "admin-key-name",
        "video-pass-through-key",
        "chat-pass-through-key",
    ],
)  # fmt: skip
def test_lone_surrogates_are_refused_at_parsing_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], where: str
) -> None:
    error = post(client, path, json.dumps(body))
    assert error["message"] == f"{where} is not valid Unicode (a lone surrogate)"
    assert error["param"] == where.split(".")[0].split("[")[0]


def test_the_error_handler_answers_a_message_that_utf8_cannot_encode() -> None:
    response = error_response(InvalidRequestError("bad key 'k\ud800'", param="k\udfff"), "POST", "/x")
    body = json.loads(response.body)
    assert body["error"]["message"] == "bad key 'k\\ud800'"
    assert body["error"]["param"] == "k\\udfff"


def deep(depth: int) -> str:
    """A JSON array nested `depth` levels deep, as text (json.dumps itself recurses)."""
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize(
    ("path", "body", "param", "where"),
    [
        (CHAT, f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "x": {deep(1000)}}}', "x",
         "x" + "[0]" * (MAX_NESTING_DEPTH - 1)),
        (SEARCH, f'{{"query": "hi", "filter": {{"lang": {deep(600)}}}}}', "filter",
         "filter.lang" + "[0]" * (MAX_NESTING_DEPTH - 2)),
        (DOCS, f'{{"documents": [{{"id": "b", "text": "t", "metadata": {{"m": {deep(300)}}}}}]}}', "documents",
         "documents[0].metadata.m" + "[0]" * (MAX_NESTING_DEPTH - 4)),
        ("/v1/collections", f'{{"name": "c3", "metadata": {{"m": {deep(300)}}}}}', "metadata",
         "metadata.m" + "[0]" * (MAX_NESTING_DEPTH - 2)),
        ("/v1/images/generations", f'{{"prompt": "a cat", "extra": {deep(800)}}}', "extra",
         "extra" + "[0]" * (MAX_NESTING_DEPTH - 1)),
    ],
    ids=["chat-pass-through", "search-filter", "document-metadata", "collection-metadata", "video-pass-through"],
)  # fmt: skip
def test_bodies_nested_past_the_limit_are_refused_naming_the_field(
    client: TestClient, path: str, body: str, param: str, where: str
) -> None:
    error = post(client, path, body)
    assert error["message"] == f"{where}: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels"
    assert error["param"] == param


@pytest.mark.parametrize("path", [SEARCH, CHAT, "/v1/images/generations", "/v1/admin/keys"])
@pytest.mark.parametrize("depth", [1000, 100_000])
def test_bodies_nested_past_what_the_parser_can_read_are_refused_naming_the_field(
    client: TestClient, depth: int, path: str
) -> None:
    body = f'{{"query": "hi", "filter": {{"a\\u00e9": [0, {{"b": [1, 2, {deep(depth)}]}}]}}}}'
    error = post(client, path, body)
    where = "filter.a\u00e9[1].b[2]" + "[0]" * (MAX_NESTING_DEPTH - 5)
    assert (error["message"], error["param"]) == (
        f"{where}: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels",
        "filter",
    )


def test_brackets_inside_strings_are_not_nesting(client: TestClient) -> None:
    text = '[{"\\"' * 2000  # brackets, quotes and escapes inside strings: text, not structure
    documents = [{"id": "brackets", "text": text, "metadata": {"k": "{" * 100}}]
    response = client.post(DOCS, json={"documents": documents})
    assert response.status_code == 200, response.text


def test_the_lone_surrogate_scan_walks_any_depth_without_recursion() -> None:
    body: Any = "\ud800"
    for _ in range(20_000):  # far past the interpreter's recursion limit
        body = [body]
    with pytest.raises(InvalidRequestError) as raised:
        require_unicode({"x": body})
    assert raised.value.message.startswith("x[0][0]") and raised.value.param == "x"


def test_deep_filters_name_the_field_path_and_the_limit(client: TestClient) -> None:
    deep: dict[str, Any] = {"lang": "en"}
    for _ in range(20):
        deep = {"$and": [deep]}
    error = post(client, SEARCH, json.dumps({"query": "hi", "filter": deep}))
    assert error["param"] == "filter"
    assert error["message"] == "filter" + ".$and[0]" * 9 + ": filters nest at most 8 levels of $and/$or, got 9"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"query": "hi", "filter": {"n": {"$gt": 10**400}}}, "filter.n.$gt"),
        ({"query": "hi", "filter": {"n": {"$in": [1, -(2**63) - 1]}}}, "filter.n.$in[1]"),
    ],
    ids=["range-bound", "membership-value"],
)
def test_filter_integers_beyond_64_bits_are_refused(client: TestClient, body: dict[str, Any], where: str) -> None:
    value = body["filter"]["n"].get("$gt", -(2**63) - 1)
    error = post(client, SEARCH, json.dumps(body))
    assert (error["message"], error["param"]) == (f"{where}: integer {value} out of range [-2**63, 2**63-1]", "filter")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_min_score_is_refused(client: TestClient, number: str) -> None:
    error = post(client, SEARCH, '{"query": "hi", "min_score": ' + number + "}")
    assert error == {
        "message": "min_score: Input should be a finite number",
        "type": "invalid_request_error",
        "param": "min_score",
        "code": None,
    }


@pytest.mark.parametrize(
    ("path", "body", "param", "where"),
    [
        (DOCS, '{"documents": [{"id": "b", "text": "t", "metadata": {"n": NaN}}]}', "documents",
         "documents.0.metadata.n"),
        (SEARCH, '{"query": "hi", "filter": {"price": {"$lt": Infinity}}}', "filter", "filter.price.$lt"),
        (DELETE, '{"filter": {"price": -Infinity}}', "filter", "filter.price"),
        ("/v1/collections", '{"name": "c4", "metadata": {"w": NaN}}', "metadata", "metadata.w"),
        ("/v1/admin/teams/t1", '{"limits": {"monthly_budget": Infinity}}', "limits", "limits.monthly_budget"),
    ],
    ids=["metadata", "filter-range", "delete-filter", "collection-metadata", "team-budget"],
)  # fmt: skip
def test_non_finite_numbers_are_refused_in_every_body(
    client: TestClient, path: str, body: str, param: str, where: str
) -> None:
    method = client.put if path.startswith("/v1/admin/teams") else client.post
    response = method(path, content=body.encode())
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == f"{where}: Input should be a finite number"
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"title": "x" * 5000}, "documents[0].metadata.title: string of 5,000 characters > maximum 4,096"),
        ({"n": 2**70}, f"documents[0].metadata.n: integer {2**70} out of range [-2**63, 2**63-1]"),
        ({"n": -(2**63) - 1}, f"documents[0].metadata.n: integer {-(2**63) - 1} out of range [-2**63, 2**63-1]"),
        ({"tags": ["a", "y" * 4097]}, "documents[0].metadata.tags[1]: string of 4,097 characters > maximum 4,096"),
    ],
    ids=["long-string", "huge-integer", "integer-below-range", "long-list-item"],
)
def test_metadata_values_out_of_range_say_what_was_expected_and_what_arrived(
    client: TestClient, metadata: dict[str, Any], message: str
) -> None:
    error = post(client, DOCS, json.dumps({"documents": [{"id": "b", "text": "t", "metadata": metadata}]}))
    assert (error["message"], error["param"]) == (message, "metadata")


def test_metadata_integers_at_the_ends_of_the_range_are_kept(client: TestClient) -> None:
    metadata = {"low": -(2**63), "high": 2**63 - 1}
    response = client.post(DOCS, json={"documents": [{"id": "ends", "text": "t", "metadata": metadata}]})
    assert response.status_code == 200, response.text


def grpc_error(call: Any, request: Any, *, streamed: bool = False) -> grpc.RpcError:
    """The error a unary call (or, `streamed`, a server-streaming call read to its end) ends with."""
    with pytest.raises(grpc.RpcError) as info:
        answer = call(request, metadata=GRPC_AUTH, timeout=30)
        if streamed:
            list(answer)
    return info.value


def test_grpc_search_refuses_non_finite_min_score(channel: grpc.Channel) -> None:
    stub = gateway_pb2_grpc.SearchStub(channel)
    for number in (float("nan"), float("inf"), float("-inf")):
        error = grpc_error(stub.Search, pb.SearchRequest(collection=COLLECTION, query="hi", min_score=number))
        assert (error.code(), error.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "min_score: Input should be a finite number",
        )


@pytest.mark.parametrize(
    ("make", "details"),
    [
        (
            lambda: pb.CreateCollectionRequest(name="c5", metadata_json=f'{{"m": {deep(300)}}}'),
            f"metadata.m{'[0]' * (MAX_NESTING_DEPTH - 2)}: nested deeper than the maximum of "
            f"{MAX_NESTING_DEPTH} levels",
        ),
        (
            lambda: pb.SearchRequest(collection=COLLECTION, query="hi", filter_json=f'{{"a": {deep(600)}}}'),
            f"filter.a{'[0]' * (MAX_NESTING_DEPTH - 2)}: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels",
        ),
        (
            lambda: pb.UpsertDocumentsRequest(
                collection=COLLECTION, documents=[pb.DocumentInput(id="b", text="t", metadata_json='{"n": 1e400}')]
            ),
            "documents[0].metadata.n: Input should be a finite number",
        ),
        (
            lambda: pb.UpsertDocumentsRequest(
                collection=COLLECTION,
                documents=[pb.DocumentInput(id="b", text="t", metadata_json=json.dumps({"n": 2**64}))],
            ),
            f"documents[0].metadata.n: integer {2**64} out of range [-2**63, 2**63-1]",
        ),
        (
            lambda: pb.CreateCollectionRequest(name="c6", metadata_json='{"k\\ud800": 1}'),
            "metadata.k\\ud800 is not valid Unicode (a lone surrogate)",
        ),
        (
            lambda: pb.SearchRequest(collection=COLLECTION, query="hi", filter_json='{"a": ["\\udfff"]}'),
            "filter.a[0] is not valid Unicode (a lone surrogate)",
        ),
    ],
    ids=[
        "collection-metadata-depth",
        "filter-depth",
        "metadata-non-finite",
        "metadata-integer-range",
        "collection-metadata-surrogate",
        "filter-surrogate",
    ],
)
def test_grpc_search_refuses_what_rest_refuses(channel: grpc.Channel, make: Any, details: str) -> None:
    stub = gateway_pb2_grpc.SearchStub(channel)
    request = make()
    call = {
        pb.CreateCollectionRequest: stub.CreateCollection,
        pb.SearchRequest: stub.Search,
        pb.UpsertDocumentsRequest: stub.UpsertDocuments,
    }[type(request)]
    error = grpc_error(call, request)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details)


def test_grpc_chat_and_video_refuse_deep_json(channel: grpc.Channel) -> None:
    body = f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "x": {deep(150)}}}'
    chat = grpc_error(gateway_pb2_grpc.ChatStub(channel).Complete, pb.ChatRequest(body_json=body), streamed=True)
    assert (chat.code(), chat.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"body_json: x{'[0]' * (MAX_NESTING_DEPTH - 1)}: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels",
    )
    options = f'{{"extra": {deep(5000)}}}'
    video = grpc_error(
        gateway_pb2_grpc.ImagesStub(channel).Submit, pb.ImageRequest(prompt="a cat", options_json=options)
    )
    assert video.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert video.details().startswith("options_json: ")
