import dagster as dg

# The whole graph that exists so far, on the configured preset. Grows with the graph.
# (Snapshot-partitioned assets run per snapshot through the cache sensor's job.)
full_chain = dg.define_asset_job(
    "full_chain",
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("cache_snapshot"),
    description="Materialize every asset: raw source → clips index / text table → … (grows with the graph)",
    tags={"dagster/max_runtime": str(7 * 24 * 3600)},
)
