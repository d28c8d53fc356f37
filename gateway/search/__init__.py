"""Semantic search: collections of documents, their vectors and metadata, in a vector store."""
