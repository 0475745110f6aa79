"""Before a run starts: the memory estimate, the GPU plan, the configuration checks, and the presets."""
