"""The gateway: REST (FastAPI) and gRPC front ends over one service layer."""
