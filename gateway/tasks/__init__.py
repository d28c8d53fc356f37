"""Video generation tasks: the record (`model`), the store interface (`base`) and its SQLite and Redis stores."""
