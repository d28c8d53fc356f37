"""The reranker's python-backend models, as the export installs them into `<repository>/<model>/1/`.

They live here rather than under `model_repository/`: Triton loads every folder of a repository, so folders
tracked there before an export would stop `make up` and every test server on a checkout without a reranker.
`model.py` files run only inside Triton; the plain modules beside them are importable and tested here.
"""
