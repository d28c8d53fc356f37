"""What each key used: per key x model x UTC day counters (`record`), their prices (`pricing`), where they are
kept (`store`: Redis or SQLite, idempotent by request id) and how requests add to them (`recorder`)."""
