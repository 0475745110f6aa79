"""The parts of the Ray learner: vLLM engines, DeepSpeed ZeRO-3 ranks (full and LoRA), their rendezvous, the
Ray cluster and placement, prefix-shared packing; and the coach's own vLLM server."""
