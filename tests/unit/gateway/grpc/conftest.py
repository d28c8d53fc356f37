"""The gRPC harness's fixtures (tests/helpers/grpc_harness.py) for the tests in this folder."""

from tests.helpers.grpc_harness import harness, harness_factory, loop_thread

__all__ = ["harness", "harness_factory", "loop_thread"]
