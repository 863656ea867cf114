"""``Engine``: the user's own training loop on taskfit's strategies, precision plugins and checkpoint format
(mirrors Lightning Fabric)."""

from taskfit.engine.engine import Engine, EngineDataLoader, EngineModule, EngineOptimizer, unwrap_module

__all__ = ["Engine", "EngineDataLoader", "EngineModule", "EngineOptimizer", "unwrap_module"]
