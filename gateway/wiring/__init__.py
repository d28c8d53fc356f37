"""The composition root: every object the gateway runs, built from its settings groups, one module per feature
(`keys`, `embeddings`, `chat`, `video`, `search`), put together by `services.open_services`. Nothing outside this
package (and `gateway.app`, which serves what it builds) constructs a store, a client or a service from settings.
"""
