"""Search by words and by both: lexical (BM25 over the analyzer's terms) and hybrid (dense and lexical fused)
through the REST and gRPC APIs, on a real gateway, real Triton and the embedded store (the first two tests on a
Milvus with full text search too: Milvus Lite 2.5.1's engine); English and Chinese."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import SearchSettings
from localtriton.server import TritonProcess
from tests.helpers.checkout import ROOT
from tests.helpers.milvus_fixtures import MilvusLite, milvus_lite_server  # noqa: F401 (a fixture)
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import create, search, upsert

pytestmark = pytest.mark.slow

DOCUMENTS = [
    {"id": "reset", "text": "How do I reset the password of my account?", "metadata": {"lang": "en"}},
    {
        "id": "sku",
        "text": "Replacement filter cartridge, part number XK-4711, fits every model.",
        "metadata": {"lang": "en"},
    },
    {"id": "login", "text": "I forgot my credentials and cannot sign in.", "metadata": {"lang": "en"}},
    {"id": "gpu", "text": "推理服务器在 GPU 上运行嵌入模型", "metadata": {"lang": "zh"}},
    {"id": "weather", "text": "明天北京的天气怎么样", "metadata": {"lang": "zh"}},
    {"id": "cat", "text": "The cat slept all afternoon on the warm windowsill.", "metadata": {"lang": "en"}},
]


def ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()["data"]]


@pytest.fixture
def gateway(
    request: pytest.FixtureRequest,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> RunningGateway:
    """On the embedded store, or (parametrized "milvus-2.5") on Milvus Lite, shared by the session."""
    if getattr(request, "param", "embedded") == "milvus-2.5":
        lite: MilvusLite = request.getfixturevalue("milvus_lite_server")
        running = gateway_factory(triton.grpc_url, search=SearchSettings(milvus_uri=lite.uri, milvus_index="AUTOINDEX"))
        http.delete(f"{running.base_url}/v1/collections/kb")  # an earlier test's
    else:
        running = gateway_factory(triton.grpc_url)
    create(http, running, "kb")
    assert upsert(http, running, "kb", DOCUMENTS).status_code == 200
    return running


STORES = pytest.mark.parametrize("gateway", ["embedded", "milvus-2.5"], indirect=True)


@STORES
def test_each_mode_finds_what_it_is_for_and_says_which_score_it_carries(
    gateway: RunningGateway, http: httpx.Client
) -> None:
    # words: a part number means nothing to the embedding model, BM25 finds it; inflections meet through stemming
    lexical = search(http, gateway, "kb", query="xk-4711", mode="lexical", top_k=3).json()
    assert lexical["data"][0]["id"] == "sku" and len(lexical["data"]) == 1  # only one document has either term
    assert lexical["data"][0]["score_type"] == "bm25" and lexical["data"][0]["score"] > 0
    assert "scores" not in lexical["data"][0] and lexical["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
    assert ids(search(http, gateway, "kb", query="resetting passwords", mode="lexical", top_k=1)) == ["reset"]
    # Chinese, segmented: a word of the document, and single characters
    assert ids(search(http, gateway, "kb", query="北京天气", mode="lexical", top_k=1)) == ["weather"]
    assert ids(search(http, gateway, "kb", query="服务器", mode="lexical", top_k=1)) == ["gpu"]
    # meaning: no word in common with its answer
    assert ids(search(http, gateway, "kb", query="unable to log into my profile", top_k=1)) == ["login"]
    dense = search(http, gateway, "kb", query="unable to log into my profile", mode="dense", top_k=1).json()
    assert dense["data"][0]["score_type"] == "cosine" and dense["usage"]["prompt_tokens"] > 0
    # both: the word match and the meaning match in one list, each hit with its score in each list
    hybrid = search(http, gateway, "kb", query="XK-4711 sign in problem", mode="hybrid", top_k=3).json()
    found = {hit["id"]: hit for hit in hybrid["data"]}
    assert {"sku", "login"} <= set(found)
    assert found["sku"]["score_type"] == "weighted" and "lexical" in found["sku"]["scores"]
    assert set(found["login"]["scores"]) <= {"dense", "lexical"} and "dense" in found["login"]["scores"]
    scores = [hit["score"] for hit in hybrid["data"]]
    assert scores == sorted(scores, reverse=True) and scores[0] <= 2  # each list's best scales to 1


@STORES
def test_filters_top_k_and_min_score_work_in_every_mode(gateway: RunningGateway, http: httpx.Client) -> None:
    for mode in ("dense", "lexical", "hybrid"):
        chinese = search(http, gateway, "kb", query="GPU 服务器 天气", mode=mode, filter={"lang": "zh"}, top_k=10)
        assert set(ids(chinese)) <= {"gpu", "weather"} and "gpu" in ids(chinese), mode
        assert len(ids(search(http, gateway, "kb", query="the password cat", mode=mode, top_k=1))) == 1, mode
    every = search(http, gateway, "kb", query="password account cat", mode="lexical", top_k=10).json()["data"]
    threshold = (every[0]["score"] + every[-1]["score"]) / 2
    above = search(http, gateway, "kb", query="password account cat", mode="lexical", min_score=threshold, top_k=10)
    assert ids(above) == [hit["id"] for hit in every if hit["score"] >= threshold] and len(ids(above)) < len(every)
    fused = search(http, gateway, "kb", query="password account", mode="hybrid", top_k=10).json()["data"]
    assert ids(search(http, gateway, "kb", query="password account", mode="hybrid", min_score=fused[0]["score"])) == [
        fused[0]["id"]
    ]


def test_rrf_fusion_and_the_weights(gateway: RunningGateway, http: httpx.Client) -> None:
    body: dict[str, Any] = {"query": "XK-4711 sign in problem", "mode": "hybrid", "top_k": 6}
    ranked = search(http, gateway, "kb", **body, fusion={"method": "rrf", "k": 10}).json()["data"]
    assert ranked[0]["score_type"] == "rrf" and 0 < ranked[0]["score"] <= 2 / 11  # first in both lists at most
    lexical_only = search(http, gateway, "kb", **body, fusion={"weights": {"dense": 0}}).json()["data"]
    assert [h["id"] for h in lexical_only if "lexical" in h["scores"]] == ids(
        search(http, gateway, "kb", query=body["query"], mode="lexical", top_k=6)
    )[: len([h for h in lexical_only if "lexical" in h["scores"]])]


def test_the_lexical_index_follows_every_upsert_and_delete(gateway: RunningGateway, http: httpx.Client) -> None:
    assert ids(search(http, gateway, "kb", query="windowsill", mode="lexical")) == ["cat"]
    assert upsert(http, gateway, "kb", [{"id": "cat", "text": "A dog barked at the mailman."}]).status_code == 200
    assert ids(search(http, gateway, "kb", query="windowsill", mode="lexical")) == []
    assert ids(search(http, gateway, "kb", query="mailman", mode="lexical")) == ["cat"]
    assert http.delete(f"{gateway.base_url}/v1/collections/kb/documents/cat").status_code == 200
    assert ids(search(http, gateway, "kb", query="mailman", mode="hybrid", top_k=10)).count("cat") == 0


def test_bad_modes_and_fusions_are_refused_naming_the_field(gateway: RunningGateway, http: httpx.Client) -> None:
    def refused(**body: Any) -> str:
        """The error's param, checked to be named in its message too."""
        response = search(http, gateway, "kb", query="q", **body)
        assert response.status_code == 400, response.text
        param: str = response.json()["error"]["param"]
        assert param in response.json()["error"]["message"], response.text
        return param

    assert refused(mode="sparse") == "mode"
    assert refused(mode="dense", fusion={"method": "rrf"}) == "fusion"
    response = search(http, gateway, "kb", query="q", mode="hybrid", fusion={"method": "sum"})
    assert response.status_code == 400 and "fusion.method" in response.json()["error"]["message"]
    assert refused(mode="hybrid", fusion={"k": 0}) == "fusion.k"
    assert refused(mode="hybrid", fusion={"weights": {"dense": 101}}) == "fusion.weights"
    assert refused(mode="hybrid", fusion={"weights": {"sparse": 1}}) == "fusion.weights"
    assert refused(mode="hybrid", fusion={"candidates": 0}) == "fusion.candidates"
    assert refused(mode="hybrid", fusion={"unknown": 1}).startswith("fusion")


def test_grpc_searches_in_every_mode(gateway: RunningGateway) -> None:
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        lexical = stub.Search(gateway_pb2.SearchRequest(collection="kb", query="XK-4711", mode="lexical", top_k=1))
        assert [(h.id, h.score_type) for h in lexical.data] == [("sku", "bm25")]
        fusion = gateway_pb2.SearchFusion(method="weighted", weights={"dense": 0.5}, candidates=20)
        hybrid = stub.Search(
            gateway_pb2.SearchRequest(collection="kb", query="XK-4711 sign in", mode="hybrid", fusion=fusion, top_k=3)
        )
        assert hybrid.data[0].score_type == "weighted" and "sku" in [h.id for h in hybrid.data]
        assert dict(next(h for h in hybrid.data if h.id == "sku").scores).keys() >= {"lexical"}
        with pytest.raises(grpc.RpcError) as bad:
            stub.Search(gateway_pb2.SearchRequest(collection="kb", query="q", mode="hybrid", fusion={"k": 0}))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "fusion.k" in str(bad.value.details())
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Search(gateway_pb2.SearchRequest(collection="kb", query="q", mode="fuzzy"))
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "mode" in str(unknown.value.details())


def test_the_demo_walks_through_search(
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.GATEWAY = gateway_factory(triton.grpc_url).base_url
    for _ in range(2):  # a second run replaces the first one's collection
        demo.search_walkthrough(http)
    shown = capsys.readouterr().out
    assert shown.count("search: 5 documents upserted into collection 'demo'") == 2
    assert "lexical: filter (bm25" in shown and "hybrid: login (weighted" in shown
    assert "rerank: no reranker is served" in shown  # this Triton has none: the demo says so and goes on
    assert "'where do backups go?' -> guide, characters" in shown and "Backups." in shown
