"""GPU clouds behind one contract (base.py), looked up through an explicit registry (registry.py)."""
