import dagster as dg

# One partition per immutable training-cache snapshot (manifests/v000123.json → "v000123").
cache_snapshots = dg.DynamicPartitionsDefinition(name="cache_snapshots")
