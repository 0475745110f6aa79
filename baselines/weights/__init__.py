"""Models and their weights: resolving a model name, each role's weights (own, shared, LoRA, frozen), LoRA
adapters on one base, model shapes and dtypes, and the transformers policy that generates with them."""
