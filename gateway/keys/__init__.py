"""API keys with identity: each key has a team, a name, scopes, an optional expiry and limits.

Modules: `model` (the key, its limits, hashing and prefixes), `families` (route family of a path or gRPC
method), `keys_file` (the YAML keys file), `store` (keys created through the admin API: Redis or SQLite),
`resolver` (header -> key from one in-memory index, kept current in the background), `limiter` and `lua/`
(the per-key and per-team limits, in Redis or in process), `gatekeeper` (401 / 403 / 429 for REST and gRPC),
`middleware` (the REST side), `context` (the gRPC call's key), `admin` (the admin API's logic), `names`
(Redis key names, days and months) and `services` (everything built from the settings).
"""
