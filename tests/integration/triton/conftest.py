from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from localtriton.server import TritonProcess


@pytest.fixture
def grpc_client(triton: TritonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()


@pytest.fixture
def http_client(triton: TritonProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(triton.http_url)
    yield client
    client.close()
