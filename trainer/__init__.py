"""What runs on the node: the Ray Train entrypoint, the LoRA recipe, datasets, the tiny model, the model card.

Nothing here imports fleet.broker or workers: this package travels to the node in the Ray job's runtime_env.
"""
